package server

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/beaconplane/beacon/internal/tlsfiles"
)

// securityWarnings lists the listeners reachable from other machines
// without TLS or without authentication. Start logs each at warning level
// and the banner prints them: such a listener lets anyone on the network
// read the registry, and without authentication write it.
func (s *Server) securityWarnings() []string {
	var out []string
	if s.http.ln != nil {
		host, _, _ := net.SplitHostPort(s.http.ln.Addr().String())
		if !isLoopback(host) {
			if s.httpTLS == nil {
				out = append(out, fmt.Sprintf("the HTTP API on %s is plain HTTP on a non-loopback address: anyone on the network can read it and see secrets in transit; give %s", s.http.ln.Addr(), s.cfg.setting("Config.Security.HTTPTLS.CertFile", "Config.Security.HTTPTLS.KeyFile")))
			}
			if !s.authEnforced() {
				out = append(out, fmt.Sprintf("the HTTP API on %s has no authentication on a non-loopback address: anyone who reaches it can register, change and remove instances; run with %s (embedded etcd) or front an etcd with auth enabled", s.http.ln.Addr(), s.cfg.setting("Config.Security.Auth")))
			}
		}
	}
	if s.member.etcd != nil {
		for _, set := range []struct {
			field string
			files [2]string // its certificate and key file settings
			urls  []string
			tls   bool
			auth  bool
		}{
			{"Config.ListenClientURLs", [2]string{"Config.Security.ClientTLS.CertFile", "Config.Security.ClientTLS.KeyFile"}, s.cfg.ListenClientURLs, s.sec.ClientTLS.CertFile != "", true},
			{"Config.ListenPeerURLs", [2]string{"Config.Security.PeerTLS.CertFile", "Config.Security.PeerTLS.KeyFile"}, s.cfg.ListenPeerURLs, s.sec.PeerTLS.CertFile != "", false},
		} {
			name := s.cfg.setting(set.field)
			for _, raw := range set.urls {
				u, err := url.Parse(raw)
				if err != nil || isLoopback(u.Hostname()) {
					continue
				}
				if !set.tls {
					out = append(out, fmt.Sprintf("%s %s is plain HTTP on a non-loopback address: give %s (and a trusted CA with client certificate authentication)", name, raw, s.cfg.setting(set.files[:]...)))
				}
				if !set.auth && set.tls && !s.sec.PeerTLS.ClientCertAuth {
					out = append(out, fmt.Sprintf("%s %s accepts any TLS client as a member (no %s): anyone who reaches it can take part in the cluster's consensus; give %s", name, raw, s.cfg.setting("Config.Security.PeerTLS.ClientCertAuth"), s.cfg.setting("Config.Security.PeerTLS.ClientCertAuth", "Config.Security.PeerTLS.TrustedCAFile")))
				}
				if set.auth && !s.authEnforced() && !s.sec.ClientTLS.ClientCertAuth {
					out = append(out, fmt.Sprintf("%s %s accepts etcd clients without authentication: anyone who reaches it can delete every instance (etcdctl del --prefix /); run with %s or %s", name, raw, s.cfg.setting("Config.Security.Auth"), s.cfg.setting("Config.Security.ClientTLS.ClientCertAuth")))
				}
			}
		}
	}
	// A certificate not valid yet (a clock behind the CA's) is refused by
	// every peer until it is.
	for _, t := range []struct {
		files TLSFiles
		field string
	}{{s.sec.ClientTLS, "Config.Security.ClientTLS.CertFile"}, {s.sec.PeerTLS, "Config.Security.PeerTLS.CertFile"}} { // the HTTP API's: its reloader warns
		if t.files.CertFile == "" {
			continue
		}
		if warn, err := tlsfiles.CheckCertificate(t.files.CertFile, t.files.KeyFile, time.Now()); err == nil && warn != "" {
			out = append(out, s.cfg.setting(t.field)+": "+warn)
		}
	}
	if s.dns.addr != "" {
		if host, _, err := net.SplitHostPort(s.dns.addr); err == nil && !isLoopback(host) {
			out = append(out, fmt.Sprintf("DNS on %s answers anyone on the network, without authentication or encryption, with every instance this server's etcd user may read: keep %s on loopback or a trusted network, or give the server an etcd user (%s) limited to the namespaces DNS should publish", s.dns.addr, s.cfg.setting("Config.DNS.Addr"), s.cfg.setting("Config.Backend.Etcd.Username")))
		}
	}
	if s.xds.addr != "" {
		if host, _, err := net.SplitHostPort(s.xds.addr); err == nil && !isLoopback(host) {
			if s.sec.XDSTLS.CertFile == "" {
				out = append(out, fmt.Sprintf("xDS on %s is plain gRPC on a non-loopback address: anyone on the path can read and alter where clients send their traffic; give %s", s.xds.addr, s.cfg.setting("Config.Security.XDSTLS.CertFile", "Config.Security.XDSTLS.KeyFile")))
			}
			if !s.authEnforced() {
				out = append(out, fmt.Sprintf("xDS on %s serves every namespace to anyone who reaches it on a non-loopback address: run with %s (clients then see only what their etcd user may read)", s.xds.addr, s.cfg.setting("Config.Security.Auth")))
			}
		}
	}
	return out
}

// authEnforced reports whether etcd authentication is on for the HTTP API.
func (s *Server) authEnforced() bool {
	a := s.authn().auth
	if a == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	on, _ := a.enabled(ctx)
	return on
}

// logSecurityWarnings logs every warning of securityWarnings, and a
// root password file others may read.
func (s *Server) logSecurityWarnings() {
	for _, w := range s.securityWarnings() {
		s.log.Warn("SECURITY: listener exposed without protection", "problem", w)
	}
	if w := passwordFileWarning(s.sec.RootPasswordFile, s.cfg.setting("Config.Security.RootPasswordFile")); w != "" {
		s.log.Warn("SECURITY: secret readable by others", "problem", w)
	}
	if w := s.unusedRootPasswordWarning(); w != "" {
		s.log.Warn("SECURITY: authentication is off although a root password is given", "problem", w)
	}
}

// unusedRootPasswordWarning says when a root password is given
// (BEACON_ROOT_PASSWORD or --auth-root-password-file) without --auth while
// etcd authentication is off: nothing uses it, and whoever set it most
// likely believes authentication is on. (Without --auth it is used, to
// authenticate the server itself, only where etcd authentication is
// already on: a data directory an --auth start enabled it in.)
func (s *Server) unusedRootPasswordWarning() string {
	if s.sec.Auth || (s.sec.RootPassword == "" && s.sec.RootPasswordFile == "") || s.authEnforced() {
		return ""
	}
	given := EnvRootPassword + " is set"
	if s.sec.RootPasswordFile != "" {
		given = s.cfg.setting("Config.Security.RootPasswordFile") + " is given"
	}
	auth := s.cfg.setting("Config.Security.Auth")
	return given + " but " + auth + " is not, and etcd authentication is off: the password is unused and every request is " +
		"served without authentication; add " + auth + " to enable it (or remove the password)"
}

// passwordFileWarning says what is wrong with a password file that users
// other than its owner may read or write ("" if nothing, or no file). It
// warns rather than refuses: a Kubernetes secret volume mounts files
// 0644 unless told otherwise (defaultMode), inside a pod of its own.
func passwordFileWarning(path, name string) string {
	if path == "" {
		return ""
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o077 == 0 {
		return ""
	}
	return fmt.Sprintf("%s %s has mode %04o: users other than its owner can read the etcd root password; chmod 600 it (on Kubernetes: defaultMode: 0400 on the secret volume)", name, path, fi.Mode().Perm())
}
