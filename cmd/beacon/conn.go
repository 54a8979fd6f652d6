package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	filestore "github.com/beaconplane/beacon/store/file"
	natsstore "github.com/beaconplane/beacon/store/nats"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The etcdctl variables the client commands honour where Beacon's own
// (ETCD_ENDPOINTS, ETCD_AUTH_*) are unset.
const (
	envEtcdctlEndpoints      = "ETCDCTL_ENDPOINTS"
	envEtcdctlUser           = "ETCDCTL_USER"
	envEtcdctlPassword       = "ETCDCTL_PASSWORD"
	envEtcdctlCACert         = "ETCDCTL_CACERT"
	envEtcdctlCert           = "ETCDCTL_CERT"
	envEtcdctlKey            = "ETCDCTL_KEY"
	envEtcdctlSkipVerify     = "ETCDCTL_INSECURE_SKIP_TLS_VERIFY"
	envEtcdctlDialTimeout    = "ETCDCTL_DIAL_TIMEOUT"
	envEtcdctlCommandTimeout = "ETCDCTL_COMMAND_TIMEOUT"
	envWriteOut              = "ETCDCTL_WRITE_OUT"
)

// etcdctl's defaults.
const (
	defaultDialTimeout    = 2 * time.Second
	defaultCommandTimeout = 5 * time.Second
)

// connHelp explains, in every client command's --help, how it reaches the
// store.
const connHelp = `Connection (flags win over variables; Beacon's variables over etcdctl's):
  --endpoints     ETCD_ENDPOINTS, then ETCDCTL_ENDPOINTS (default http://localhost:2379,
                  beacon serve's embedded etcd); host:port, http:// or https:// URLs
  --user          ETCD_AUTH_USERNAME, then ETCDCTL_USER (name, or name:password)
  --password      ETCD_AUTH_PASSWORD, then ETCDCTL_PASSWORD
  --cacert        ETCD_AUTH_CA, then ETCDCTL_CACERT
  --cert, --key   ETCD_AUTH_CLIENT_CERT/ETCD_AUTH_CLIENT_KEY, then ETCDCTL_CERT/ETCDCTL_KEY
  --insecure-skip-tls-verify   ETCDCTL_INSECURE_SKIP_TLS_VERIFY
  --dial-timeout  ETCDCTL_DIAL_TIMEOUT (default 2s): a refused or silent endpoint fails after it
  --command-timeout  ETCDCTL_COMMAND_TIMEOUT (default 5s): bound of each request
  -o/-w           ETCDCTL_WRITE_OUT=json selects JSON output`

// registryConnHelp adds the backend choice for the registry commands.
const registryConnHelp = connHelp + `
  --backend       BEACON_DISCOVERY_BACKEND: etcd (default), memory (process-local:
                  for trying the commands), file (BEACON_FILE_DIR), nats (NATS_URL)
                  or kubernetes; else Dynamo's DYN_DISCOVERY_BACKEND: kubernetes,
                  etcd, kv_store (etcd), file (Beacon's file store, in BEACON_FILE_DIR:
                  not Dynamo's DYN_FILE_KV format) or mem (memory). Keys are Beacon's
                  (<root>/services/...), not Dynamo's v1/instances/...,
                  unless --layout dynamo (below)

` + layoutHelp + `

` + kubeEnvHelp

// clientFlags are the connection flags of the client commands, etcdctl's
// names and defaults.
type clientFlags struct {
	cmd                *cobra.Command
	backend            string
	endpoints          []string
	user, password     string
	cacert, cert, key  string
	insecureSkipVerify bool
	dialTimeout        time.Duration
	commandTimeout     time.Duration
	timeout            time.Duration // --timeout: sets both (older spelling)
	kube               *backendFlags // --kubeconfig, --kube-namespaces (backend_kube.go); nil without --backend

	// Set by resolve.
	dial, command time.Duration
}

// addClientFlags registers the connection flags on cmd; withBackend adds
// --backend (the registry commands can use any store, tokens only etcd).
func addClientFlags(cmd *cobra.Command, withBackend bool) *clientFlags {
	c := &clientFlags{cmd: cmd}
	f := cmd.Flags()
	if withBackend {
		f.StringVar(&c.backend, "backend", backend.Etcd, "backend: etcd, memory, file, nats or kubernetes (env "+backend.EnvVar+")")
		c.kube = &backendFlags{}
		addKubeFlags(cmd, c.kube)
	}
	f.StringSliceVar(&c.endpoints, "endpoints", []string{etcdstore.DefaultEndpoint}, "etcd endpoints (env ETCD_ENDPOINTS, then ETCDCTL_ENDPOINTS)")
	f.StringVar(&c.user, "user", "", "etcd user name, or name:password (env ETCD_AUTH_USERNAME, then ETCDCTL_USER)")
	f.StringVar(&c.password, "password", "", "etcd password (env ETCD_AUTH_PASSWORD, then ETCDCTL_PASSWORD)")
	f.StringVar(&c.cacert, "cacert", "", "CA file to verify etcd's certificate (env ETCD_AUTH_CA, then ETCDCTL_CACERT)")
	f.StringVar(&c.cert, "cert", "", "client certificate file for etcd (env ETCD_AUTH_CLIENT_CERT, then ETCDCTL_CERT)")
	f.StringVar(&c.key, "key", "", "client key file for etcd (env ETCD_AUTH_CLIENT_KEY, then ETCDCTL_KEY)")
	f.BoolVar(&c.insecureSkipVerify, "insecure-skip-tls-verify", false, "do not verify etcd's certificate (testing only; env "+envEtcdctlSkipVerify+")")
	f.DurationVar(&c.dialTimeout, "dial-timeout", defaultDialTimeout, "bound on connecting to the store (env "+envEtcdctlDialTimeout+")")
	f.DurationVar(&c.commandTimeout, "command-timeout", defaultCommandTimeout, "bound on each request (env "+envEtcdctlCommandTimeout+")")
	f.DurationVar(&c.timeout, "timeout", 0, "sets both --dial-timeout and --command-timeout")
	_ = f.MarkHidden("timeout")
	return c
}

// resolve combines flags, Beacon's variables and etcdctl's into the
// backend configuration, checking each value and naming, on error, the
// flag or variable it came from.
func (c *clientFlags) resolve() (backend.Config, error) {
	f := c.cmd.Flags()
	cfg := backend.FromEnv()
	if err := c.resolveBackend(&cfg); err != nil {
		return cfg, err
	}

	var err error
	if c.dial, err = c.duration("dial-timeout", envEtcdctlDialTimeout); err != nil {
		return cfg, err
	}
	if c.command, err = c.duration("command-timeout", envEtcdctlCommandTimeout); err != nil {
		return cfg, err
	}
	if cfg.Name != backend.Etcd {
		return cfg, usage(cfg.Validate()) // the backend's own variables, named
	}

	e := etcdstore.Config{DialTimeout: c.dial, RequestTimeout: c.command}
	if e.Endpoints, err = resolveEndpoints(f); err != nil {
		return cfg, err
	}
	if e.Username, e.Password, err = resolveCredentials(f); err != nil {
		return cfg, err
	}
	ca := lookup(f, "cacert", etcdstore.EnvCA, envEtcdctlCACert)
	cert := lookup(f, "cert", etcdstore.EnvClientCert, envEtcdctlCert)
	key := lookup(f, "key", etcdstore.EnvClientKey, envEtcdctlKey)
	if err := checkTLSFiles(ca, cert, key); err != nil {
		return cfg, err
	}
	e.CA, e.ClientCert, e.ClientKey = ca.val, cert.val, key.val
	if e.Configure, err = resolveSkipVerify(f); err != nil {
		return cfg, err
	}
	if err := e.Validate(); err != nil {
		return cfg, usage(err)
	}
	e.Logger = cfg.Etcd.Logger
	cfg.Etcd = e
	return cfg, nil
}

// resolveBackend sets the backend's name (etcd for commands without
// --backend) and the Kubernetes backend's settings.
func (c *clientFlags) resolveBackend(cfg *backend.Config) error {
	f := c.cmd.Flags()
	if f.Lookup("backend") == nil {
		cfg.Name = backend.Etcd
		return nil
	}
	be, err := backendSetting(f)
	if err != nil {
		return err
	}
	if err := backend.CheckName(be.val); err != nil {
		return usagef("%v: %v", be, err)
	}
	cfg.Name = be.val
	if c.kube != nil {
		if be.val == backend.Kubernetes {
			if err := c.kube.checkKube(f); err != nil {
				return err
			}
		}
		cfg.DriverEnv = c.kube.kubeEnv()
	}
	return nil
}

// resolveEndpoints returns the etcd endpoints, checked, without
// repetitions.
func resolveEndpoints(f *pflag.FlagSet) ([]string, error) {
	var eps []string
	src := lookup(f, "endpoints", etcdstore.EnvEndpoints, envEtcdctlEndpoints)
	if src.env == "" {
		eps, _ = f.GetStringSlice("endpoints")
	} else {
		eps = etcdstore.SplitEndpoints(src.val)
	}
	var list []string
	for _, ep := range eps {
		ep = strings.TrimSpace(ep)
		if err := etcdstore.CheckEndpoint(ep); err != nil {
			return nil, usagef("%v: %v", src, err)
		}
		if !slices.Contains(list, ep) {
			list = append(list, ep)
		}
	}
	if len(list) == 0 {
		// A variable of blanks; an empty flag is refused before (checkEmptyFlags).
		return nil, usagef("%v: no endpoint in it: give host:port or URLs, comma separated, or unset it for %s", src, etcdstore.DefaultEndpoint)
	}
	return list, nil
}

// resolveCredentials returns the etcd user and password: both or neither.
func resolveCredentials(f *pflag.FlagSet) (username, password string, err error) {
	user := lookup(f, "user", etcdstore.EnvUsername, envEtcdctlUser)
	pass := lookup(f, "password", etcdstore.EnvPassword, envEtcdctlPassword)
	username, password = user.val, pass.val
	if name, pw, ok := strings.Cut(user.val, ":"); ok {
		if pass.val != "" {
			return "", "", usagef("%v gives a password and %v gives another: give it once", user, pass)
		}
		username, password = name, pw
	}
	switch {
	case username != "" && password == "":
		return "", "", usagef("%v has no password: use --user name:password, --password or %s", user, envEtcdctlPassword)
	case username == "" && password != "":
		return "", "", usagef("%v is set without a user: set --user (or %s)", pass, envEtcdctlUser)
	}
	return username, password, nil
}

// resolveSkipVerify returns what turns off the verification of etcd's
// certificate, when --insecure-skip-tls-verify (or its variable) asks
// for it; else nil.
func resolveSkipVerify(f *pflag.FlagSet) (func(*clientv3.Config), error) {
	skip, _ := f.GetBool("insecure-skip-tls-verify")
	if fl := f.Lookup("insecure-skip-tls-verify"); !fl.Changed {
		if v := os.Getenv(envEtcdctlSkipVerify); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, usagef("%s=%q: want true or false", envEtcdctlSkipVerify, v)
			}
			skip = b
		}
	}
	if !skip {
		return nil, nil
	}
	return func(cc *clientv3.Config) {
		if cc.TLS == nil {
			cc.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		cc.TLS.InsecureSkipVerify = true //nolint:gosec // asked for with --insecure-skip-tls-verify
	}, nil
}

// duration reads a duration flag, else the old --timeout, else env, else
// the default; it must be positive.
func (c *clientFlags) duration(flag, env string) (time.Duration, error) {
	f := c.cmd.Flags()
	fl := f.Lookup(flag)
	d, _ := f.GetDuration(flag)
	switch {
	case fl.Changed:
	case f.Lookup("timeout").Changed:
		d, _ = f.GetDuration("timeout")
		flag = "timeout"
	default:
		if v := os.Getenv(env); v != "" {
			p, err := time.ParseDuration(v)
			if err != nil || p <= 0 {
				return 0, usagef("%s=%q: want a positive duration such as 2s", env, v)
			}
			return p, nil
		}
	}
	if d <= 0 {
		return 0, usagef("--%s %v: must be positive", flag, d)
	}
	return d, nil
}

// openEtcd connects to etcd (the token commands: tokens live in etcd
// whatever backend the registry uses).
func (c *clientFlags) openEtcd(ctx context.Context) (*etcdstore.Store, error) {
	cfg, err := c.resolve()
	if err != nil {
		return nil, err
	}
	st, err := etcdstore.Open(ctx, cfg.Etcd)
	if err != nil {
		return nil, fmt.Errorf("reach the discovery registry: %w", err)
	}
	return st, nil
}

// requestCtx bounds one request by the command timeout.
func (c *clientFlags) requestCtx(parent context.Context) (context.Context, context.CancelFunc) {
	d := c.command
	if d <= 0 {
		d = defaultCommandTimeout
	}
	return context.WithTimeout(parent, d)
}

// checkTLSFiles checks the TLS files for etcd before anything connects:
// each given file exists, the CA file holds a PEM certificate, and the
// certificate and key go together and load. Errors are bad usage and name
// the flag or variable the file came from (the store, which only sees the
// paths, would name its own variables).
func checkTLSFiles(ca, cert, key setting) error {
	for _, s := range []setting{ca, cert, key} {
		if s.val == "" {
			continue
		}
		if _, err := os.Stat(s.val); err != nil {
			return usagef("%v: %v", s, unwrapPathError(err))
		}
	}
	if (cert.val == "") != (key.val == "") {
		return usagef("--%s and --%s (or their variables) go together: set both or neither", cert.flag, key.flag)
	}
	if ca.val != "" {
		pem, err := os.ReadFile(ca.val)
		if err != nil {
			return usagef("%v: %v", ca, unwrapPathError(err))
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return usagef("%v holds no PEM certificate: give the CA bundle that signed etcd's certificate", ca)
		}
	}
	if cert.val != "" {
		if _, err := tls.LoadX509KeyPair(cert.val, key.val); err != nil {
			return usagef("%v with %v: %v", cert, key, err)
		}
	}
	return nil
}

// unwrapPathError drops *os.PathError's repetition of the path.
func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok { //nolint:errorlint // os.Stat returns it unwrapped
		return pe.Err
	}
	return err
}

// registryConn reaches the registry: the connection flags and --root.
type registryConn struct {
	*clientFlags
	root string
	// existing: the command only reads or removes what is there (ls,
	// watch, rm), so a file store or NATS bucket must already exist: a
	// mistyped BEACON_FILE_DIR or BEACON_NATS_BUCKET is an error, not an
	// empty store in a new directory or bucket.
	existing bool
}

func addRegistryConnFlags(cmd *cobra.Command) *registryConn {
	c := &registryConn{clientFlags: addClientFlags(cmd, true)}
	cmd.Flags().StringVar(&c.root, "root", "", `keyspace root: keys live under <root>/services/ (e.g. "/beacon")`)
	addLayoutFlag(cmd) // layout.go
	return c
}

// addExistingRegistryFlags declares the flags of a command that only
// reads or removes what a registry holds (ls, watch, rm): the connection
// flags, and -o with its default and help.
func addExistingRegistryFlags(cmd *cobra.Command, output *string, def, help string) *registryConn {
	c := addRegistryConnFlags(cmd)
	c.existing = true
	cmd.Flags().StringVarP(output, "output", "o", def, help)
	return c
}

// openQuery checks -o against formats and the command's optional
// namespace[/component[/endpoint]] argument (none: every namespace), then
// opens the registry with the process logger.
func (c *registryConn) openQuery(cmd *cobra.Command, args []string, output string, formats ...string) (registry.Registry, beacon.Query, error) {
	var q beacon.Query
	if err := checkOutput(output, formats...); err != nil {
		return nil, q, err
	}
	if len(args) == 1 {
		var err error
		if q, err = parseQueryArg(args[0]); err != nil {
			return nil, q, err
		}
	}
	logger, err := newLogger(cmd.ErrOrStderr())
	if err != nil {
		return nil, q, err
	}
	r, err := c.open(cmd.Context(), registry.Config{Logger: logger})
	if err == nil && registry.LayoutOf(r) != registry.LayoutDynamo {
		if err = q.ValidateWritten(); err != nil { // Beacon's layout holds its writers' names only
			_ = r.Close()
			return nil, q, usage(err)
		}
	}
	return r, q, err
}

// open opens the registry of the chosen backend: a registry over its
// store, or a registry of its own (kubernetes). Closing it closes the
// store too.
func (c *registryConn) open(ctx context.Context, cfg registry.Config) (registry.Registry, error) {
	bcfg, err := c.resolve()
	if err != nil {
		return nil, err
	}
	if cfg.Layout, err = resolveLayout(c.cmd, bcfg.BackendName()); err != nil {
		return nil, err
	}
	cfg.Root = c.root
	if err := cfg.Validate(); err != nil {
		return nil, usagef("--root %q: %w", c.root, err)
	}
	bcfg.File.MustExist = c.existing
	bcfg.NATS.MustExist = c.existing
	return c.openRegistry(ctx, bcfg, cfg)
}

// openRegistry opens the registry bcfg and cfg describe, within the dial
// and command timeouts.
func (c *clientFlags) openRegistry(ctx context.Context, bcfg backend.Config, cfg registry.Config) (registry.Registry, error) {
	octx, cancel := context.WithTimeout(ctx, c.dial+c.command)
	defer cancel()
	// The stores' warnings (a file store's directory replaced under the
	// process, a long wait for its lock, a torn log repaired) go where the
	// registry's go; they were discarded.
	bcfg = bcfg.WithLogger(cfg.Logger)
	r, err := backend.OpenRegistry(octx, bcfg, cfg)
	if errors.Is(err, filestore.ErrNoStore) || errors.Is(err, natsstore.ErrNoBucket) {
		return nil, usagef("open %s backend: %w", bcfg.BackendName(), err) // BEACON_FILE_DIR or BEACON_NATS_BUCKET names no store
	}
	if err != nil {
		return nil, withFlagNames(fmt.Errorf("open %s backend: %w", bcfg.BackendName(), err))
	}
	return r, nil
}

// backendName is the backend the flags and variables choose ("" when
// they are wrong: open reports why).
func (c *registryConn) backendName() string {
	cfg, err := c.resolve()
	if err != nil {
		return ""
	}
	return cfg.BackendName()
}
