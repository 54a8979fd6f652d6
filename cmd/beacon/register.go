package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/spf13/cobra"
)

func init() { rootCmd.AddCommand(newRegisterCmd()) }

// checkOutput validates an -o value.
func checkOutput(flag string, allowed ...string) error {
	for _, a := range allowed {
		if flag == a {
			return nil
		}
	}
	return usagef("-o %q: want %s", flag, strings.Join(allowed, " or "))
}

// parseQueryArg parses the namespace[/component[/endpoint]] argument of
// ls and watch. An empty argument is refused: `beacon ls "$NS"` with NS
// unset would otherwise list every namespace (leave the argument out for
// that).
func parseQueryArg(arg string) (beacon.Query, error) {
	if arg == "" {
		return beacon.Query{}, usagef("the query argument is empty: give namespace[/component[/endpoint]], or no argument for every namespace")
	}
	q, err := beacon.ParseQuery(arg)
	if err != nil {
		return q, usage(err)
	}
	return q, nil
}

// parseEndpoint parses the ns/component/endpoint argument of register.
func parseEndpoint(arg string) (beacon.Query, error) {
	q, err := beacon.ParseQuery(arg)
	if err != nil {
		return q, usage(err)
	}
	if q.Endpoint == "" {
		return q, usagef("%q: want namespace/component/endpoint, e.g. prod/api/http", arg)
	}
	return q, nil
}

// parseMeta parses repeated --meta key=value flags.
func parseMeta(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	md := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usagef("--meta %q: want key=value", p)
		}
		if _, dup := md[k]; dup {
			return nil, usagef("--meta %q: key %q given twice", p, k)
		}
		md[k] = v
	}
	return md, nil
}

// registerFlags are beacon register's settings.
type registerFlags struct {
	conn      *registryConn
	addr      string
	id        string
	transport string
	meta      []string
	ttl       string
	drain     time.Duration
	output    string

	startTimeout time.Duration

	check         string // --check, ParseCheck's form; "": none
	checkInterval time.Duration
	checkTimeout  time.Duration
	checkRise     int
	checkFall     int
}

func newRegisterCmd() *cobra.Command {
	rf := &registerFlags{}
	cmd := &cobra.Command{
		Use:   "register namespace/component/endpoint --addr host:port",
		Short: "Register an instance and keep it alive until interrupted",
		Long: `Register one instance of namespace/component/endpoint at --addr and keep its
lease alive until interrupted (SIGINT or SIGTERM); then deregister it (after
--drain of draining status, if set: a second SIGINT or SIGTERM cuts the drain
short and deregisters at once; a third exits without deregistering, leaving the
lease to expire) and exit. It prints the instance and every change of the
session's state: if etcd says the lease ended, the instance is registered
again, under the same ID, as soon as the store answers; while no keep-alive is
answered for longer than the TTL it prints the lease as unconfirmed and keeps
renewing it.

A store that does not answer at start (not running yet, unreachable) is
waited for: each attempt is bounded by --dial-timeout and --command-timeout,
each failure is logged with its reason, and the first is printed as "state
waiting". --start-timeout bounds the wait (then it exits 1); 0, the default,
keeps trying until interrupted. Wrong credentials, certificates or settings
are not waited for.

Lease TTL: --ttl or BEACON_LEASE_TTL (default 10s; 1s to 1h).

Health check: --check declares how beacon serve's checkers probe the instance
from outside, once per --check-interval for the whole cluster: grpc (the
grpc.health.v1 service at --addr; grpc:SERVICE asks for one service), http:/PATH
(GET of PATH; a 2xx answer passes), or tcp (a connection opens); checks
speak plaintext only (HTTP/1.1, h2c for gRPC: no TLS). After
--check-fall failures in a row the instance is left out of routing (DNS,
resolvers, xDS) as a draining one is, and after --check-rise passes in a row it
is back; it stays registered either way. ttl:DURATION: the service reports
itself, on this command's standard input — each line says it is fine (its
content is not read); the check fails one DURATION after the last report (at
most a quarter more, 10s at most: the checker reads reports every DURATION/4)
and passes again at the next; when standard input ends no report follows.
Lines are coalesced to at most one write per DURATION/4. A ttl check has no
--check-interval, --check-timeout, --check-rise or --check-fall.

` + registryConnHelp,
		Example: `  beacon register prod/api/http --addr 10.0.0.5:8080 --meta zone=a --meta weight=10
  beacon register prod/llm/generate --addr 10.0.0.6:9000 --transport tcp --ttl 5s -o json
  beacon register prod/api/http --addr 10.0.0.5:8080 --check http:/healthz --check-interval 5s
  while ./selftest; do echo ok; sleep 10; done | beacon register prod/batch/jobs --addr 10.0.0.7:7000 --check ttl:30s`,
		Args: cobra.ExactArgs(1),
		RunE: rf.run,
	}
	rf.conn = addRegistryConnFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&rf.addr, "addr", "", "address where callers reach the instance: host:port or a URL (required)")
	f.StringVar(&rf.id, "id", "", "instance ID, 16 lower-case hex digits (default: a random one)")
	f.StringVar(&rf.transport, "transport", "", "protocol spoken at --addr: grpc, http, tcp, nats...")
	f.StringArrayVar(&rf.meta, "meta", nil, "metadata key=value (repeatable; 4 KiB in total)")
	f.StringVar(&rf.ttl, "ttl", registry.DefaultLeaseTTL.String(), "lease TTL, e.g. 10s (env "+registry.LeaseTTLEnv+")")
	f.DurationVar(&rf.drain, "drain", 0, "on interrupt, advertise the instance as draining for this long before removing it (a second signal cuts it short; 0, the default: removed at once)")
	f.StringVarP(&rf.output, "output", "o", "text", "text or json (one JSON object per line)")
	f.DurationVar(&rf.startTimeout, "start-timeout", 0, "give up (exit 1) if the store has not answered within this long at start; 0: keep trying until interrupted")
	f.StringVar(&rf.check, "check", "", "health check: grpc, grpc:SERVICE, http:/PATH or tcp (run by beacon serve), or ttl:DURATION (reported on standard input) (default: none)")
	f.DurationVar(&rf.checkInterval, "check-interval", beacon.DefaultCheckInterval, "how often the check runs (500ms to 10m; with --check)")
	f.DurationVar(&rf.checkTimeout, "check-timeout", beacon.DefaultCheckTimeout, "how long one probe may take (50ms up to --check-interval; with --check)")
	f.IntVar(&rf.checkRise, "check-rise", beacon.DefaultCheckRise, "passes in a row that bring a failing instance back (1 to 100; with --check)")
	f.IntVar(&rf.checkFall, "check-fall", beacon.DefaultCheckFall, "failures in a row that take a passing instance out (1 to 100; with --check)")
	allowZero(cmd, "drain", "removed at once")
	allowZero(cmd, "start-timeout", "keep trying until interrupted")
	_ = cmd.MarkFlagRequired("addr")
	return cmd
}

// run registers the instance the flags and args describe and keeps it
// until interrupted.
func (rf *registerFlags) run(cmd *cobra.Command, args []string) error {
	if err := checkOutput(rf.output, "text", "json"); err != nil {
		return err
	}
	q, err := parseEndpoint(args[0])
	if err != nil {
		return err
	}
	md, err := parseMeta(rf.meta)
	if err != nil {
		return err
	}
	ttlSet := lookup(cmd.Flags(), "ttl", registry.LeaseTTLEnv)
	lease, err := registry.ParseTTL(ttlSet.val)
	if err != nil {
		return usagef("%v: %w", ttlSet, err)
	}
	if rf.drain < 0 {
		return usagef("--drain %v: must not be negative", rf.drain)
	}
	check, err := rf.parseCheck(cmd)
	if err != nil {
		return err
	}
	in := beacon.Instance{Namespace: q.Namespace, Component: q.Component, Endpoint: q.Endpoint,
		ID: rf.id, Address: rf.addr, Transport: rf.transport, Metadata: md, Check: check}
	if err := checkNewInstance(in); err != nil {
		return err
	}
	logger, err := newLogger(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if cmd.Flags().Changed("ttl") && rf.conn.backendName() == backend.Kubernetes {
		return usagef("--ttl: the kubernetes backend has no lease (an instance is live while its pod is Ready)")
	}
	if rf.startTimeout < 0 {
		return usagef("--start-timeout %v: must not be negative (0: keep trying until interrupted)", rf.startTimeout)
	}
	emit := newEmitter(cmd.OutOrStdout(), rf.output == "json")
	st := starter{conn: rf.conn, cfg: registry.Config{LeaseTTL: lease, Logger: logger}, timeout: rf.startTimeout, log: logger, emit: emit}
	r, reg, err := st.register(ctx, in)
	if err != nil || r == nil {
		return err // r == nil: interrupted before the store answered
	}
	defer r.Close()
	reports, err := newTTLReports(rf.conn, r, reg, cmd.InOrStdin(), emit, logger)
	if err != nil {
		return errors.Join(err, reg.Close())
	}
	return runRegister(ctx, rf.conn, r, reg, rf.drain, emit, reports)
}

// checkFlags are the flags that set a check's timing, each with the field
// it sets, in the order parseCheck validates them (the timeout is checked
// against the interval).
var checkFlags = []struct {
	name string
	set  func(*beacon.Check, *registerFlags)
}{
	{"check-interval", func(c *beacon.Check, rf *registerFlags) { c.Interval = rf.checkInterval }},
	{"check-timeout", func(c *beacon.Check, rf *registerFlags) { c.Timeout = rf.checkTimeout }},
	{"check-rise", func(c *beacon.Check, rf *registerFlags) { c.Rise = rf.checkRise }},
	{"check-fall", func(c *beacon.Check, rf *registerFlags) { c.Fall = rf.checkFall }},
}

// parseCheck returns the check --check and its timing flags declare (nil
// for none). Timing flags left out leave their field zero: the check
// takes the default. An invalid value is bad usage naming its flag.
func (rf *registerFlags) parseCheck(cmd *cobra.Command) (*beacon.Check, error) {
	flags := cmd.Flags()
	if rf.check == "" {
		for _, cf := range checkFlags {
			if flags.Changed(cf.name) {
				return nil, usagef("--%s: set --check too (grpc, grpc:SERVICE, http:/PATH, tcp or ttl:DURATION): without a check there is nothing to time", cf.name)
			}
		}
		return nil, nil
	}
	c, err := beacon.ParseCheck(rf.check)
	if err != nil {
		return nil, usagef("--check %q: %w", rf.check, err)
	}
	if c.Kind == beacon.CheckTTL && rf.conn.backendName() == backend.Kubernetes {
		return nil, usagef("--check %q: the kubernetes backend keeps no TTL reports: give the container an exec readinessProbe, "+
			"or declare grpc, http:/PATH or tcp", rf.check)
	}
	for _, cf := range checkFlags {
		if !flags.Changed(cf.name) {
			continue
		}
		if c.Kind == beacon.CheckTTL {
			return nil, usagef("--%s: a ttl check has no %s: it fails one TTL after the last report and passes again at the next one",
				cf.name, strings.TrimPrefix(cf.name, "check-"))
		}
		cf.set(&c, rf)
		if err := c.Validate(); err != nil {
			return nil, usagef("--%s %s: %w", cf.name, flags.Lookup(cf.name).Value, err)
		}
	}
	return &c, nil
}

// checkNewInstance checks an instance to register, whose ID may still be
// unset (then the registry chooses one).
func checkNewInstance(in beacon.Instance) error {
	if in.ID != "" {
		if err := beacon.ValidateID(in.ID); err != nil {
			return usagef("--id: %w", err)
		}
	}
	probe := in
	if probe.ID == "" {
		probe.ID = "0000000000000000"
	}
	return usage(probe.Validate())
}

// registerLine is one line of `beacon register -o json`.
type registerLine struct {
	Event     string           `json:"event"` // state (waiting: at start), registered, state, draining, interrupted, deregistered; stopped (before registering)
	Instance  *beacon.Instance `json:"instance,omitempty"`
	State     string           `json:"state,omitempty"`
	Lease     string           `json:"lease,omitempty"`
	TTL       string           `json:"ttl,omitempty"`
	Error     string           `json:"error,omitempty"`
	Conflicts []string         `json:"conflicts,omitempty"`
	Warning   string           `json:"warning,omitempty"`
}

// leased is what a registry with a session lease (a store registry) adds.
type leased interface {
	Lease() store.LeaseID
	LeaseTTL() time.Duration
	GrantedTTL() time.Duration
}

// emitFunc prints one event of register: its JSON line, or its text.
type emitFunc func(l registerLine, text string)

func newEmitter(out io.Writer, asJSON bool) emitFunc {
	return func(l registerLine, text string) {
		if asJSON {
			_ = json.NewEncoder(out).Encode(l)
			return
		}
		fmt.Fprintln(out, text)
	}
}

// starter registers an instance at start, waiting for a store that does
// not answer yet.
type starter struct {
	conn    *registryConn
	cfg     registry.Config
	timeout time.Duration // bound on the wait; 0: none
	log     *slog.Logger
	emit    emitFunc
}

// Bounds of the pause between two attempts to reach the store at start.
const (
	startRetryFirst = 500 * time.Millisecond
	startRetryLast  = 5 * time.Second
)

// register opens the registry and registers in, retrying while the store
// does not answer (each attempt bounded by the connection timeouts) until
// it does, ctx ends (nil registry and error: nothing was registered), or
// s.timeout passes. Other errors (settings, credentials) end it at once.
func (s starter) register(ctx context.Context, in beacon.Instance) (registry.Registry, registry.Registration, error) {
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if s.timeout > 0 {
		wctx, cancel = context.WithTimeout(ctx, s.timeout)
	}
	defer cancel()
	var r registry.Registry
	var prev error // the last attempt's error
	since := time.Now()
	delay := startRetryFirst
	for n := 1; ; n++ {
		reg, err := s.attempt(wctx, &r, in)
		if err == nil {
			if n > 1 {
				s.log.Info("store answered; registered", "attempts", n, "waited", time.Since(since).Round(time.Millisecond))
			}
			return r, reg, nil
		}
		switch {
		case ctx.Err() != nil:
			closeRegistry(r)
			s.emit(registerLine{Event: "stopped", Error: err.Error()},
				"stopped before the store answered: nothing was registered (last attempt: "+err.Error()+")")
			return nil, nil, nil
		case wctx.Err() != nil:
			closeRegistry(r)
			if prev != nil {
				err = prev // the attempt the bound cut short says less
			}
			return nil, nil, fmt.Errorf("the store did not answer within --start-timeout %v (%d attempts): %w", s.timeout, n, err)
		case !retryableAtStart(err):
			closeRegistry(r)
			return nil, nil, err
		}
		prev = err
		if n == 1 {
			s.emit(registerLine{Event: "state", State: "waiting", Error: err.Error()}, "state waiting: "+err.Error())
		}
		bound := "until interrupted"
		if s.timeout > 0 {
			bound = "at most --start-timeout " + s.timeout.String()
		}
		s.log.Warn("store not reachable; waiting for it", "until", bound, "attempt", n, "retry-in", delay,
			"waited", time.Since(since).Round(time.Millisecond), "err", err)
		select {
		case <-wctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, startRetryLast)
	}
}

// attempt opens the registry into *r if it is not open yet, then registers
// in.
func (s starter) attempt(ctx context.Context, r *registry.Registry, in beacon.Instance) (registry.Registration, error) {
	if *r == nil {
		opened, err := s.conn.open(ctx, s.cfg)
		if err != nil {
			return nil, err
		}
		*r = opened
	}
	rctx, cancel := s.conn.requestCtx(ctx)
	defer cancel()
	return (*r).Register(rctx, in)
}

func closeRegistry(r registry.Registry) {
	if r != nil {
		_ = r.Close()
	}
}

// announce prints what was registered, after its warnings (a TTL too
// short for an election, routing metadata DNS and xDS cannot read), and
// returns how long deregistering may take.
func announce(conn *registryConn, r registry.Registry, got beacon.Instance, emit emitFunc) time.Duration {
	warn := func(w string) { emit(registerLine{Event: "warning", Warning: w}, "warning: "+w) }
	l, ok := r.(leased)
	if ok && conn.backendName() == backend.Etcd {
		if w := registry.TTLWarning(l.LeaseTTL()); w != "" {
			warn(w)
		}
	}
	for _, w := range got.RoutingWarnings() {
		warn(w)
	}
	if !ok {
		emit(registerLine{Event: "registered", Instance: &got},
			fmt.Sprintf("registered %s at %s; Ctrl-C deregisters", got.Ref(), printable(got.Address)))
		return conn.command
	}
	lease := fmt.Sprintf("%x", l.Lease())
	ttl := cmp.Or(l.GrantedTTL(), l.LeaseTTL()) // what the store granted: etcd rounds 1s up to 2s
	emit(registerLine{Event: "registered", Instance: &got, Lease: lease, TTL: ttl.String()},
		fmt.Sprintf("registered %s at %s (lease %s, ttl %v); Ctrl-C deregisters", got.Ref(), printable(got.Address), lease, ttl))
	return l.LeaseTTL()
}

// runRegister keeps reg advertised, printing every change of the session's
// state and writing its TTL check's reports (if reports is not nil), until
// ctx ends; then it stops the reports and deregisters.
func runRegister(ctx context.Context, conn *registryConn, r registry.Registry, reg registry.Registration, drain time.Duration, emit emitFunc,
	reports *ttlReports) error {
	got := reg.Instance()
	bound := announce(conn, r, got, emit)
	defer reports.start(ctx)()
	var states <-chan registry.StateChange
	if sr, ok := r.(registry.SessionReporter); ok {
		states = sr.States()
	}
	vctx, stopVisibility := context.WithCancel(ctx)
	defer stopVisibility()
	visibility := checkVisibility(vctx, r) // backend_kube.go
	for {
		select {
		case l := <-visibility:
			text := "visible to watchers now"
			if l.Error != "" {
				text = l.Error
			}
			emit(l, text)
		case c, ok := <-states:
			if !ok {
				return nil
			}
			l := registerLine{Event: "state", State: c.State.String()}
			text := "state " + c.State.String()
			if c.Lease != store.NoLease {
				l.Lease = fmt.Sprintf("%x", c.Lease)
				text += " (lease " + l.Lease + ")"
			}
			if c.Err != nil {
				l.Error = c.Err.Error()
				text += ": " + c.Err.Error()
			}
			for _, ref := range c.Conflicts {
				l.Conflicts = append(l.Conflicts, ref.String())
			}
			if len(c.Conflicts) > 0 {
				text += " (conflicts: " + strings.Join(l.Conflicts, ", ") + ")"
			}
			emit(l, text)
		case <-ctx.Done():
			return deregister(ctx, r, reg, drain, bound, emit)
		}
	}
}

// deregister ends a registration once ctx has ended: after drain of
// draining status, cut short by a second signal (urgent), then removed.
// bound bounds the removal.
func deregister(ctx context.Context, r registry.Registry, reg registry.Registration, drain, bound time.Duration, emit emitFunc) error {
	got := reg.Instance()
	// Deregister with a fresh, bounded context: ctx is done.
	dctx, cancel := context.WithTimeout(urgent(ctx), drain+bound)
	defer cancel()
	var err error
	if drain > 0 {
		// The line shows the instance as it is advertised now: draining.
		draining := got
		draining.Status = beacon.StatusDraining
		emit(registerLine{Event: "draining", Instance: &draining},
			fmt.Sprintf("draining %s for %v (Ctrl-C again, or SIGTERM, removes it now)", got.Ref(), drain))
		drained := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-dctx.Done():
				if urgent(ctx).Err() != nil {
					emit(registerLine{Event: "interrupted", Instance: &draining},
						fmt.Sprintf("second signal: drain of %s cut short, removing it now", got.Ref()))
				}
			case <-drained:
			}
		}()
		err = reg.Drain(dctx, registry.DrainGrace(drain))
		close(drained)
		wg.Wait()
	} else {
		err = reg.Close()
	}
	if err != nil {
		if _, ok := r.(leased); !ok {
			return fmt.Errorf("deregister %s: %w", got.Ref(), err)
		}
		return fmt.Errorf("deregister %s: %w (its lease expires within %v anyway)", got.Ref(), err, bound)
	}
	emit(registerLine{Event: "deregistered", Instance: &got}, fmt.Sprintf("deregistered %s", got.Ref()))
	return nil
}

// sortedMeta renders metadata as k=v,k=v in key order.
func sortedMeta(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = printable(k + "=" + md[k])
	}
	return strings.Join(keys, ",")
}

// isInterrupt reports whether err is the end of a command's context.
func isInterrupt(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, registry.ErrWatchClosed))
}
