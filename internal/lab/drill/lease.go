package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Lease drills: every path that keeps a lease alive — PathSession (the Go
// library's sessions, in this process), PathRegister (`beacon register`
// processes), PathHTTP (HTTP API registrations heartbeated through a
// `beacon serve --etcd-endpoints`) and PathProxy (etcd clients keeping
// leases alive through a `beacon proxy`) — against every kind of member
// fault — FaultHang (SIGSTOP), FaultBlackhole (its link down: packets
// dropped), FaultSlowDisk (every WAL sync delayed) and FaultRefuse (killed:
// connections refused) — on a follower and on the leader of a 3-member
// cluster, each fault held for 2 × the TTL under test. All keepers run at
// once, in groups of several TTLs, through every trial, beside a steady
// write load (a slow disk slows writes, and reads waiting for them).
//
// Per fault, role, path and TTL it counts leases lost (ended for want of a
// renewal, or given up by their keeper, or reported lost while etcd held
// them) apart from leases etcd revoked although they were renewed in time
// (a resumed etcd 3.7 leader revokes those it believes expired: etcd's
// doing, see docs/operations.md). The goal is 0 lost at FollowerTTL for a
// follower fault, and at LeaderTTL (the documented shortest TTL that rides
// out an election, registry.MinElectionTTL) for a leader fault.

// The paths.
const (
	PathSession  = "session"
	PathRegister = "register"
	PathHTTP     = "http"
	PathProxy    = "proxy"
)

// The faults.
const (
	FaultHang      = "hang"
	FaultBlackhole = "blackhole"
	FaultSlowDisk  = "slow-disk"
	FaultRefuse    = "refuse"
)

// LeaseFaults lists every fault, in the order RunLease runs them.
var LeaseFaults = []string{FaultHang, FaultBlackhole, FaultSlowDisk, FaultRefuse}

// LeaseConfig configures RunLease.
type LeaseConfig struct {
	// Members runs the cluster members: etcdproc.EtcdMembers (with
	// FsyncDelay and fsync on, for the slow-disk fault) or ServeNodes.
	Members etcdproc.Launcher
	// Network makes the cluster's network (etcdproc.Netns for the
	// black-hole fault; default loopback).
	Network func() (*etcdproc.Network, error)
	// Dir holds the members' data and every process's log.
	Dir string
	// Beacon returns the command that runs the beacon binary with args
	// (register, serve, proxy).
	Beacon func(args ...string) *exec.Cmd

	// FollowerTTL is the TTL asserted for follower faults (default 3 s);
	// LeaderTTL the one for leader faults (default
	// registry.MinElectionTTL). Every path keeps leases of both, and of
	// ExtraTTLs (measured, not asserted), through every trial.
	FollowerTTL, LeaderTTL time.Duration
	ExtraTTLs              []time.Duration
	// Keepers per path and TTL (defaults 8 sessions, 2 register
	// processes, 16 HTTP registrations, 8 proxied etcd clients).
	Sessions, Registrants, HTTP, Proxied int
	// Faults to run (default LeaseFaults), each on a follower and then on
	// the leader.
	Faults []string
	// FsyncDelay is the slow disk's delay per WAL sync (default 500 ms:
	// slow, yet under etcd's 1 s election timeout, so that a slow leader
	// stays leader).
	FsyncDelay time.Duration

	// Log receives the sessions' and stores' logs (nil: none); Progress
	// one line per trial.
	Log      *slog.Logger
	Progress io.Writer
}

func (c LeaseConfig) withDefaults() LeaseConfig {
	if c.FollowerTTL == 0 {
		c.FollowerTTL = 3 * time.Second
	}
	if c.LeaderTTL == 0 {
		c.LeaderTTL = registry.MinElectionTTL
	}
	for p, n := range map[*int]int{&c.Sessions: 8, &c.Registrants: 2, &c.HTTP: 16, &c.Proxied: 8} {
		if *p == 0 {
			*p = n
		}
	}
	if len(c.Faults) == 0 {
		c.Faults = LeaseFaults
	}
	if c.FsyncDelay == 0 {
		c.FsyncDelay = 500 * time.Millisecond
	}
	defaultHarness(&c.Network, &c.Log, &c.Progress)
	return c
}

// Validate checks the configuration.
func (c LeaseConfig) Validate() error {
	var errs []error
	if c.Members == nil || c.Beacon == nil || c.Dir == "" {
		errs = append(errs, errors.New("drill: LeaseConfig.Members, Beacon and Dir are required"))
	}
	for _, t := range append([]time.Duration{c.FollowerTTL, c.LeaderTTL}, c.ExtraTTLs...) {
		if t != 0 && (t < 2*time.Second || t > time.Minute || t%time.Second != 0) {
			errs = append(errs, fmt.Errorf("drill: TTL %v: want whole seconds in [2s, 1m] (etcd grants whole seconds, 2 s at least)", t))
		}
	}
	for _, n := range []int{c.Sessions, c.Registrants, c.HTTP, c.Proxied} {
		if n < 0 || n > 500 {
			errs = append(errs, fmt.Errorf("drill: %d keepers per path: want 1 to 500", n))
		}
	}
	for _, f := range c.Faults {
		if !slices.Contains(LeaseFaults, f) {
			errs = append(errs, fmt.Errorf("drill: unknown fault %q (want some of %s)", f, strings.Join(LeaseFaults, ", ")))
		}
	}
	if c.FsyncDelay < 0 || c.FsyncDelay > 10*time.Second {
		errs = append(errs, fmt.Errorf("drill: fsync delay %v: want 0 to 10s", c.FsyncDelay))
	}
	return errors.Join(errs...)
}

// ttls returns every TTL the keepers use, ascending.
func (c LeaseConfig) ttls() []time.Duration {
	all := append([]time.Duration{c.FollowerTTL, c.LeaderTTL}, c.ExtraTTLs...)
	slices.Sort(all)
	return slices.Compact(all)
}

// LeaseResult is what one path's keepers of one TTL went through in one
// trial.
type LeaseResult struct {
	Fault string        `json:"fault"`
	Role  string        `json:"role"` // follower or leader
	Path  string        `json:"path"`
	TTL   time.Duration `json:"ttl_ns"`
	// Asserted: this TTL is the one the goal applies to for this role.
	Asserted bool `json:"asserted"`
	Leases   int  `json:"leases"`
	// Lost counts leases that ended for want of a renewal, were given up
	// by their keeper, or were reported lost while etcd held them
	// (FalseLoss, counted in Lost too).
	Lost      int `json:"lost"`
	FalseLoss int `json:"false_loss"`
	// Revoked counts leases etcd ended although they were renewed in time
	// (a resumed leader revokes those it believes expired).
	Revoked int `json:"revoked"`
	// Unconfirmed counts sessions whose renewals went unanswered for a
	// whole TTL (they went on renewing).
	Unconfirmed int `json:"unconfirmed"`
	// Failed counts renewal attempts that failed (informational).
	Failed int `json:"failed"`
	// MaxGap is the longest time between two answered renewals of one
	// keeper in the trial (informational; HTTP and proxied keepers only:
	// sessions renew inside their process).
	MaxGap time.Duration `json:"max_gap_ns"`
	// LeaderGap is, for a fault on the leader, how long the other members
	// went without a leader (up to the fault's end when they elected none).
	LeaderGap time.Duration `json:"leader_gap_ns"`
	// Elections is how many raft terms the members went through while the
	// fault lasted (-1: not known). A fault on a follower moves no leader
	// on a machine that gives etcd its heartbeats in time (etcd campaigns
	// with pre-vote): one that did is the machine's doing.
	Elections int      `json:"elections"`
	Skipped   string   `json:"skipped,omitempty"`
	Notes     []string `json:"notes,omitempty"`
}

// ElectionBudget is the longest election registry.MinElectionTTL is
// derived for: etcd's default timing elects a new leader within two
// election timeouts (docs/registry.md, "Lease TTL and elections").
const ElectionBudget = 2 * time.Second

// Met reports whether the result meets the goal: no lost lease where the
// TTL is asserted (and anything goes where it is not). A result the goal
// cannot judge (Void) is not met.
func (r LeaseResult) Met() bool {
	return r.Skipped == "" && r.Void() == "" && (!r.Asserted || r.Lost == 0)
}

// Void says why the goal cannot judge an asserted result that lost leases
// ("" if it can): the cluster went without a leader for longer than
// ElectionBudget, the election the TTL is derived for (a machine too busy
// for etcd's timing elects late); or, on a fault of a follower, whose TTL
// is derived for a steady leader, the members elected one meanwhile (a
// machine too busy for etcd's heartbeats; CI's went so during a follower's
// slow disk, and every lease of both TTLs ended, those of the separate
// `beacon register` processes too). Leases kept through either still meet
// the goal; a false loss (FalseLoss) is never excused.
func (r LeaseResult) Void() string {
	if !r.Asserted || r.Lost == 0 || r.FalseLoss > 0 {
		return ""
	}
	switch {
	case r.LeaderGap > ElectionBudget:
		return fmt.Sprintf("the members had no leader for %v, beyond the %v election the %v TTL is derived for", round(r.LeaderGap), ElectionBudget, r.TTL)
	case r.Role == "follower" && r.Elections > 0:
		return fmt.Sprintf("the members elected a leader %d time(s) during a fault of a follower, which moves none when etcd's heartbeats arrive in time: the %v TTL is derived for a steady leader", r.Elections, r.TTL)
	}
	return ""
}

// WriteLeaseTable prints lease drill results, one row per fault, role,
// path and TTL.
func WriteLeaseTable(w io.Writer, results []LeaseResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FAULT\tROLE\tPATH\tTTL\tLEASES\tLOST\tFALSE LOSS\tREVOKED\tUNCONFIRMED\tFAILED RENEWALS\tMAX GAP\tNO LEADER\tGOAL")
	for _, r := range results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t-\t-\t-\t-\t-\t-\t-\t-\tskipped: %s\n", r.Fault, r.Role, r.Path, r.TTL, r.Skipped)
			continue
		}
		goal := "-"
		switch {
		case r.Void() != "":
			goal = "void"
		case r.Asserted && r.Met():
			goal = "met"
		case r.Asserted:
			goal = "MISSED"
		}
		gap := "-"
		if r.MaxGap > 0 {
			gap = round(r.MaxGap).String()
		}
		noLeader := "-"
		switch {
		case r.Role == "leader":
			noLeader = round(r.LeaderGap).String()
		case r.Elections > 0:
			noLeader = fmt.Sprintf("%d election(s)", r.Elections)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", r.Fault, r.Role, r.Path, r.TTL, r.Leases,
			r.Lost, r.FalseLoss, r.Revoked, r.Unconfirmed, r.Failed, gap, noLeader, goal)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		if v := r.Void(); v != "" {
			fmt.Fprintf(w, "%s %s %s %v: goal void: %s\n", r.Fault, r.Role, r.Path, r.TTL, v)
		}
	}
	for _, r := range results {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "%s %s %s %v: %s\n", r.Fault, r.Role, r.Path, r.TTL, n)
		}
	}
	return nil
}

// leaseEnv is the cluster, the fronts and every keeper group.
type leaseEnv struct {
	cfg     LeaseConfig
	c       *etcdproc.Cluster
	serve   *frontProc
	px      *frontProc
	refs    []*reference
	groups  []leaseGroup
	stopLd  context.CancelFunc
	loadErr chan error
	slow    string // why the slow-disk fault cannot run ("" if it can)
}

// RunLease runs the lease drills and returns one result per fault, role,
// path and TTL. A fault that cannot run here (no network namespaces for
// the black hole, no slow-disk members) gives results with Skipped set.
func RunLease(ctx context.Context, cfg LeaseConfig) ([]LeaseResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	e, err := startLeaseEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.close()
	fmt.Fprintf(cfg.Progress, "lease drills: %s, keepers per TTL: %d sessions, %d register processes, %d HTTP registrations, %d proxied etcd clients; TTLs %v (asserted: %v for a follower fault, %v for the leader)\n",
		cfg.Members.Name(), cfg.Sessions, cfg.Registrants, cfg.HTTP, cfg.Proxied, cfg.ttls(), cfg.FollowerTTL, cfg.LeaderTTL)
	var results []LeaseResult
	for _, fault := range cfg.Faults {
		for _, role := range []string{"follower", "leader"} {
			res, err := e.trial(ctx, fault, role)
			results = append(results, res...)
			if err != nil {
				return results, fmt.Errorf("drill %s on the %s: %w", fault, role, err)
			}
		}
	}
	return results, nil
}

// startLeaseEnv starts the cluster, the serve and proxy processes and
// every keeper, and waits until each renewed its lease.
func startLeaseEnv(ctx context.Context, cfg LeaseConfig) (*leaseEnv, error) {
	nw, err := cfg.Network()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cfg.Dir, "lease")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		nw.Close()
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := etcdproc.StartCluster(sctx, cfg.Members, nw, 3, dir)
	if err != nil {
		return nil, err
	}
	e := &leaseEnv{cfg: cfg, c: c}
	if err := c.Members()[0].SetFsyncDelay(0); err != nil {
		e.slow = err.Error()
	}
	if err := e.start(ctx, dir); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// start starts the fronts, the write load and the keepers.
func (e *leaseEnv) start(ctx context.Context, dir string) error {
	eps := strings.Join(e.c.Endpoints(), ",")
	var err error
	if e.serve, err = startFront(ctx, e.cfg.Beacon, "beacon serve", "--http-addr", "/readyz", filepath.Join(dir, "serve.log"),
		"serve", "--etcd-endpoints", eps, "--dns-addr="); err != nil {
		return err
	}
	if e.px, err = startFront(ctx, e.cfg.Beacon, "beacon proxy", "--listen-addr", "/health", filepath.Join(dir, "proxy.log"),
		"proxy", "--endpoints", eps); err != nil {
		return err
	}
	ns := fmt.Sprintf("lease-%d", os.Getpid()%100000)
	svc, kept := newReference(e.c, "/services/"+ns+"/"), newReference(e.c, "/drill-lease/"+ns+"/")
	e.refs = []*reference{svc, kept}
	e.startLoad("/drill-lease/" + ns + "/load")
	for _, ttl := range e.cfg.ttls() {
		if err := e.addGroups(ctx, ns, ttl, svc, kept, dir); err != nil {
			return err
		}
	}
	return e.settle(ctx, time.Now())
}

func (e *leaseEnv) addGroups(ctx context.Context, ns string, ttl time.Duration, svc, kept *reference, dir string) error {
	s, err := newSessionGroup(ctx, e.c.Endpoints(), ns, ttl, e.cfg.Sessions, e.cfg.Log)
	if err != nil {
		return err
	}
	e.groups = append(e.groups, s)
	r, err := newRegisterGroup(ctx, e.cfg.Beacon, e.c.Endpoints(), ns, ttl, e.cfg.Registrants, dir)
	if err != nil {
		return err
	}
	e.groups = append(e.groups, r)
	h, err := newHTTPGroup(ctx, e.serve, svc, ns, ttl, e.cfg.HTTP)
	if err != nil {
		return err
	}
	e.groups = append(e.groups, h)
	p, err := newProxyGroup(ctx, e.px, kept, "/drill-lease/"+ns+"/", ttl, e.cfg.Proxied)
	if err != nil {
		return err
	}
	e.groups = append(e.groups, p)
	return nil
}

// startLoad writes a key every 20 ms (a client of its own, every
// endpoint) until close, so that a slow disk slows what waits for writes.
func (e *leaseEnv) startLoad(key string) {
	ctx, cancel := context.WithCancel(context.Background())
	e.stopLd, e.loadErr = cancel, make(chan error, 1)
	go func() {
		defer close(e.loadErr)
		cli, err := clientv3.New(clientv3.Config{Endpoints: e.c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			e.loadErr <- err
			return
		}
		defer cli.Close()
		for ctx.Err() == nil {
			wctx, wcancel := context.WithTimeout(ctx, time.Second)
			_, _ = cli.Put(wctx, key, "x") // failures while members are down are expected
			wcancel()
			_ = sleepCtx(ctx, 20*time.Millisecond)
		}
	}()
}

// settle waits until every keeper renewed after since and the cluster is
// healthy.
func (e *leaseEnv) settle(ctx context.Context, since time.Time) error {
	if err := healthy(ctx, e.c); err != nil {
		return err
	}
	limit := 3*e.cfg.ttls()[len(e.cfg.ttls())-1] + 30*time.Second
	deadline := time.Now().Add(limit)
	for {
		var waiting []string
		for _, g := range e.groups {
			if !g.settled(since) {
				waiting = append(waiting, fmt.Sprintf("%s/%v", g.path(), g.ttl()))
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("keepers not all renewing %v after the fault: %s", limit, strings.Join(waiting, ", "))
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil { // renewals are the event; polled
			return err
		}
	}
}

func (e *leaseEnv) close() {
	for _, g := range e.groups {
		g.close()
	}
	if e.stopLd != nil {
		e.stopLd()
		if err := <-e.loadErr; err != nil {
			fmt.Fprintf(e.cfg.Progress, "the write load could not run (the slow disk slowed less): %v\n", err)
		}
	}
	for _, r := range e.refs {
		r.close()
	}
	if e.px != nil {
		e.px.close()
	}
	if e.serve != nil {
		e.serve.close()
	}
	e.c.Close()
}

// leaseFault is what a trial does to its target member.
type leaseFault struct {
	inject, heal func() error
	desc         string
}

// faultFor returns the fault on m, or why it cannot run here.
func (e *leaseEnv) faultFor(fault string, m *etcdproc.Member) (leaseFault, string) {
	switch fault {
	case FaultHang:
		return leaseFault{m.Pause, m.Resume, "stopped (SIGSTOP)"}, ""
	case FaultBlackhole:
		if !e.c.Network().IsNetns() {
			return leaseFault{}, "members are on loopback, not in network namespaces (those need root and iproute2)"
		}
		return leaseFault{m.Partition, m.Heal, "cut off (link down: packets dropped)"}, ""
	case FaultSlowDisk:
		if e.slow != "" {
			return leaseFault{}, e.slow
		}
		d := e.cfg.FsyncDelay
		return leaseFault{func() error { return m.SetFsyncDelay(d) }, func() error { return m.SetFsyncDelay(0) },
			fmt.Sprintf("given a slow disk (%v per WAL sync)", d)}, ""
	default: // FaultRefuse
		return leaseFault{m.Kill, m.Restart, "killed (connections refused), restarted at the end"}, ""
	}
}

// trial runs one fault on a member of role and returns a result per group.
func (e *leaseEnv) trial(ctx context.Context, fault, role string) ([]LeaseResult, error) {
	asserted := e.cfg.FollowerTTL
	if role == "leader" {
		asserted = e.cfg.LeaderTTL
	}
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	leader, err := e.c.WaitLeader(lctx)
	cancel()
	if err != nil {
		return nil, err
	}
	target := leader
	if role == "follower" {
		target = e.c.Members()[0]
		for _, m := range e.c.Members() {
			if m != leader {
				target = m
				break
			}
		}
	}
	f, skipped := e.faultFor(fault, target)
	before := make([]leaseCounts, len(e.groups))
	for i, g := range e.groups {
		g.stats().resetGap()
		before[i] = g.stats().snapshot()
	}
	var out faultOutcome
	if skipped == "" {
		if out, err = e.fault(ctx, f, 2*asserted, role == "leader"); err != nil {
			return nil, err
		}
	}
	var res []LeaseResult
	for i, g := range e.groups {
		r := LeaseResult{Fault: fault, Role: role, Path: g.path(), TTL: g.ttl(), Asserted: g.ttl() == asserted,
			Leases: g.size(), Skipped: skipped, LeaderGap: out.election, Elections: out.elections}
		if skipped == "" {
			countLease(&r, before[i], g.stats().snapshot())
		}
		res = append(res, r)
	}
	lost := 0
	for _, r := range res {
		lost += r.Lost
	}
	if skipped == "" {
		fmt.Fprintf(e.cfg.Progress, "  %s %s %s for %v (%s to %s UTC): %d lease(s) lost in all\n", role, target.Name, f.desc, 2*asserted,
			out.injected.UTC().Format(clock), out.healed.UTC().Format(clock), lost)
	} else {
		fmt.Fprintf(e.cfg.Progress, "  %s on the %s skipped: %s\n", fault, role, skipped)
	}
	return res, nil
}

// aftermath is the least time a trial watches after its fault ends: a
// resumed etcd leader's revocations wait for a leader up to etcd's request
// timeout (5 s plus two election timeouts) before they land.
const aftermath = 8 * time.Second

// faultOutcome is what the members did while a fault lasted.
type faultOutcome struct {
	// election: on the leader, how long the other members took to elect a
	// new one (the hold when they elected none while the fault lasted).
	election time.Duration
	// elections: raft terms gone through from injection to healing (-1:
	// a reading failed).
	elections int
	// injected and healed: when the fault began and ended.
	injected, healed time.Time
}

// fault injects f, holds it, heals it, watches its aftermath (a resumed
// member may act on what it missed: the longest TTL, at least aftermath)
// and waits until every keeper renewed again. On the leader (elect), it
// times the election of the next one.
func (e *leaseEnv) fault(ctx context.Context, f leaseFault, hold time.Duration, elect bool) (faultOutcome, error) {
	out := faultOutcome{elections: -1}
	term0, termErr := e.c.Term(ctx)
	if err := f.inject(); err != nil {
		return out, err
	}
	injected := time.Now()
	out.injected = injected
	election := make(chan time.Duration, 1)
	if elect {
		wctx, cancel := context.WithTimeout(ctx, hold)
		defer cancel()
		go func() { // owned by fault: it ends with wctx, before fault returns
			if _, err := e.c.WaitLeader(wctx); err != nil {
				election <- hold
				return
			}
			election <- time.Since(injected)
		}()
	} else {
		election <- 0
	}
	if err := sleepCtx(ctx, hold); err != nil {
		_ = f.heal()
		<-election
		return out, err
	}
	out.election = <-election
	if term1, err := e.c.Term(ctx); err == nil && termErr == nil {
		out.elections = int(term1 - term0)
	}
	if err := f.heal(); err != nil {
		return out, err
	}
	healed := time.Now()
	out.healed = healed
	if err := sleepCtx(ctx, max(e.cfg.ttls()[len(e.cfg.ttls())-1], aftermath)); err != nil {
		return out, err
	}
	return out, e.settle(ctx, healed)
}

// countLease fills r with what changed between two snapshots.
func countLease(r *LeaseResult, before, after leaseCounts) {
	r.Lost = after.lost - before.lost + after.falseLoss - before.falseLoss
	r.FalseLoss = after.falseLoss - before.falseLoss
	r.Revoked = after.revoked - before.revoked
	r.Unconfirmed = after.unconfirmed - before.unconfirmed
	r.Failed = after.failed - before.failed
	r.MaxGap = after.maxGap
	if len(after.notes) > len(before.notes) {
		notes := after.notes[len(before.notes):]
		if len(notes) > 5 {
			notes = append(notes[:5:5], fmt.Sprintf("... and %d more", len(notes)-5))
		}
		r.Notes = notes
	}
}
