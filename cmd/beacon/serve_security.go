package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// addSecurityFlags registers `beacon serve`'s TLS, authentication and
// limit flags, with etcd's names where etcd has them.
func addSecurityFlags(cmd *cobra.Command, s *server.Security) {
	f := cmd.Flags()
	tlsFlags := func(t *server.TLSFiles, prefix, what string) {
		f.StringVar(&t.CertFile, prefix+"cert-file", "", what+": certificate file (PEM); re-read when it changes")
		f.StringVar(&t.KeyFile, prefix+"key-file", "", what+": key file (PEM)")
		f.StringVar(&t.TrustedCAFile, prefix+"trusted-ca-file", "", what+": CA bundle that signs client certificates")
		f.BoolVar(&t.ClientCertAuth, prefix+"client-cert-auth", false, what+": require a client certificate signed by --"+prefix+"trusted-ca-file")
	}
	tlsFlags(&s.ClientTLS, "", "embedded etcd client listener (https:// in --listen-client-urls)")
	tlsFlags(&s.PeerTLS, "peer-", "embedded etcd peer listener (https:// in --listen-peer-urls)")
	tlsFlags(&s.HTTPTLS, "http-", "HTTP API listener (serves HTTPS; a verified client certificate's CN is its etcd user)")

	f.BoolVar(&s.Auth, "auth", false, "enable etcd authentication on the embedded cluster (root user created on first start) and authenticate every HTTP API request as its etcd user")
	f.StringVar(&s.RootPasswordFile, "auth-root-password-file", "", "file holding the etcd root password for --auth (or set "+server.EnvRootPassword+"; never on the command line)")
	s.RootPassword = os.Getenv(server.EnvRootPassword)
	f.StringVar(&s.AuthToken, "auth-token", "", "etcd's --auth-token: simple (default), jwt,pub-key=FILE,priv-key=FILE,sign-method=ES256[,ttl=5m] (the same files on every member), or jwt (a key pair generated in --data-dir/auth: one member); JWT lets the HTTP API accept client certificates as users")
	f.Var(secondsFlag{&s.AuthTokenTTL}, "auth-token-ttl", "lifetime of an etcd auth token (seconds, or a duration such as 5m)")
	f.UintVar(&s.BcryptCost, "bcrypt-cost", 0, "etcd's bcrypt cost for new password hashes (default 10)")
	f.StringSliceVar(&s.HostWhitelist, "host-whitelist", nil, "host names the HTTP API answers to besides IP addresses, localhost and its own URLs (* for any); others get 421")

	f.IntVar(&s.Limits.MaxWatches, "max-watches", 0, fmt.Sprintf("most watch streams the HTTP API serves (default %d; -1: no limit)", registryapi.DefaultMaxWatches))
	f.IntVar(&s.Limits.MaxWatchesPerClient, "max-watches-per-client", 0, fmt.Sprintf("most watch streams per client (user, else address) (default %d)", registryapi.DefaultMaxWatchesPerClient))
	f.IntVar(&s.Limits.MaxRegistrations, "max-registrations", 0, fmt.Sprintf("most live registrations made through this server (default %d)", registryapi.DefaultMaxRegistrations))
	f.IntVar(&s.Limits.MaxRegistrationsPerClient, "max-registrations-per-client", 0, fmt.Sprintf("most live registrations per client (default %d)", registryapi.DefaultMaxRegistrationsPerClient))
	f.IntVar(&s.Limits.MaxTokenCreations, "max-token-creations", 0, fmt.Sprintf("most discovery tokens created per minute through this server (POST /v1/tokens, /v2/discovery/new) (default %d; -1: no limit)", registryapi.DefaultMaxTokenCreations))
	f.IntVar(&s.Limits.MaxTokenCreationsPerClient, "max-token-creations-per-client", 0, fmt.Sprintf("most discovery tokens one client creates per minute (default %d)", registryapi.DefaultMaxTokenCreationsPerClient))
	f.IntVar(&s.MaxAuthClients, "max-auth-clients", 0, fmt.Sprintf("most per-user etcd clients kept for authenticated requests (default %d)", server.DefaultMaxAuthClients))
	f.Int64Var(&s.MaxBodyBytes, "max-body-bytes", 0, fmt.Sprintf("largest HTTP request body (default %d)", server.DefaultMaxBodyBytes))
	f.DurationVar(&s.RequestTimeout, "http-request-timeout", 0, fmt.Sprintf("time to read an HTTP request and write its answer; watch streams excepted (default %v)", server.DefaultRequestTimeout))
	f.DurationVar(&s.IdleTimeout, "http-idle-timeout", 0, fmt.Sprintf("close idle keep-alive connections after this long (default %v)", server.DefaultIdleTimeout))
	f.IntVar(&s.MaxConns, "http-max-connections", 0, "HTTP connections open at once; at the bound a new one takes the place of an idle one (silent ones first), and waits only while every one carries a request (default: a quarter of the open-file limit, at least 256)")
	f.IntVar(&s.MaxConnsPerClient, "http-max-connections-per-client", server.DefaultMaxConnsPerClient, "HTTP connections one client address (every local process, everyone behind one NAT or proxy) may have open at once; at the bound a new one takes the place of its oldest idle one (silent ones first), and is refused only while every one carries a request (-1: no limit; 0 is refused)")
}

// securityFlags checks the limit flags whose zero the server would read
// as "the default": given on the command line, zero is a mistake to
// report.
func securityFlags(f *pflag.FlagSet, s *server.Security) error {
	if f.Changed("http-max-connections-per-client") && s.MaxConnsPerClient == 0 {
		return usagef("--http-max-connections-per-client 0: give the most HTTP connections one client address may have open (at least 1; default %d), or -1 for no limit", server.DefaultMaxConnsPerClient)
	}
	return nil
}

// secondsFlag is etcd's --auth-token-ttl: a number of seconds, or a
// duration.
type secondsFlag struct{ d *time.Duration }

func (s secondsFlag) String() string {
	if s.d == nil || *s.d == 0 {
		return "300"
	}
	return strconv.Itoa(int(s.d.Seconds()))
}

func (s secondsFlag) Set(v string) error {
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		if n == 0 {
			return fmt.Errorf("0 is not a lifetime: want a number of seconds or a duration of at least 1s, e.g. 300 or 5m (leave it out for 300)")
		}
		*s.d = time.Duration(n) * time.Second
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second {
		return fmt.Errorf("want a number of seconds or a duration of at least 1s, e.g. 300 or 5m")
	}
	*s.d = d
	return nil
}

func (secondsFlag) Type() string { return "seconds" }
