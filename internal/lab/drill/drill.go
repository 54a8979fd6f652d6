// Package drill runs fault drills against a registry on a real etcd
// cluster of separate processes (package etcdproc): etcd 3.7.3 members, or
// `beacon serve` nodes that formed their cluster through a discovery token.
//
// Each drill keeps a steady fleet alive — Sessions registries, each with a
// client of its own as a separate process would have, each holding one
// instance and verifying its keys (a List) every keep-alive interval — and
// Watchers registries following the fleet. Every trial
// starts a victim registrant in a child process, injects the drill's fault,
// kills the victim with SIGKILL at the same moment, ends the fault, and
// measures:
//
//   - lost: steady sessions that lost their lease for want of a renewal
//     (their instance was deleted while their process was healthy); apart:
//     kept (a session's clock ran out but etcd had kept the lease) and
//     revoked (etcd ended a lease renewed in time);
//   - phantom: watchers that still listed the dead victim after its bound
//     — TTL + 1 s after its death, or after the fault ended when etcd
//     could not expire anything meanwhile, or after a new leader took over
//     plus an election timeout (a new etcd leader extends every lease by
//     its full TTL plus an election timeout) — while trailing etcd's own
//     deletion of its key (seen by a raw watch on every member) by more
//     than a second; one that followed etcd's deletion within a second
//     counts as late instead (etcd's expiry and delivery under load took
//     the time, not a stuck watch);
//   - flaps: removals of a steady instance seen by a watcher;
//   - convergence: from the fault (or, for outages, from its end) until
//     every watcher lists exactly the live fleet.
//
// The goal while quorum holds is 0 lost, 0 phantom, 0 flaps. Each trial
// also watches one more TTL after the fault ended, whose aftermath (a
// resumed etcd leader revoking leases) counts in it.
//
// The lease drills (RunLease, lease.go) check every path that keeps a lease
// alive — Go sessions, `beacon register` processes, HTTP registrations
// through `beacon serve --etcd-endpoints`, etcd clients through `beacon
// proxy` — against every kind of member fault (stopped, cut off, slow disk,
// killed), on a follower and on the leader.
//
// The package has no test dependencies: tests run short drills
// (internal/lab/drill's own tests), `beacon bench drill` runs hundreds of
// trials.
package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/store/etcd"
)

// The drills, by name.
const (
	SIGKILL       = "sigkill"        // a registrant process killed; the cluster healthy
	SinglePause   = "single-pause"   // a 1-member cluster stopped (SIGSTOP) for 2 TTL
	SingleRestart = "single-restart" // a 1-member cluster killed, restarted after 2 TTL
	LeaderKill    = "leader-kill"    // the leader of 3 killed, restarted after 2 TTL
	MemberHang    = "member-hang"    // one member of 3 stopped (SIGSTOP) for 2 TTL
	Partition     = "partition"      // one member of 3 cut off (link down) for 2 TTL
	Compaction    = "compaction"     // a watcher cut off while history changes and is compacted
	SlowConsumer  = "slow-consumer"  // a watcher that does not read while 50 changes per instance happen
)

// All lists every drill, in the order Run runs them.
var All = []string{SIGKILL, SinglePause, SingleRestart, LeaderKill, MemberHang, Partition, Compaction, SlowConsumer}

// Config configures a run.
type Config struct {
	// Members runs the cluster members (etcdproc.EtcdMembers or Serve).
	Members etcdproc.Launcher
	// Network makes the network of a new cluster: etcdproc.Loopback, or
	// etcdproc.Netns (needed by the partition drill).
	Network func() (*etcdproc.Network, error)
	// Dir holds the members' data and logs.
	Dir string
	// Registrant returns the command of a victim registrant child: this
	// program, running RegistrantMain (the environment carries its
	// settings).
	Registrant func() *exec.Cmd

	// TTL is the lease TTL of every session (default 3 s).
	TTL time.Duration
	// Sessions is the number of steady registrants (default 20).
	Sessions int
	// Watchers is the number of watching registries (default 3).
	Watchers int
	// Trials per drill (default 1).
	Trials int
	// Store is the template of every client's store configuration
	// (Endpoints are filled in). Zero fields get drill defaults sized for
	// the TTL: WatchSilenceTimeout TTL/2, ProbeTimeout 500 ms,
	// RequestTimeout TTL.
	Store etcd.Config

	// Log receives the registries' and stores' logs (nil: none).
	Log *slog.Logger
	// Progress receives one line per trial (nil: none).
	Progress io.Writer
}

func (c Config) withDefaults() Config {
	if c.TTL == 0 {
		c.TTL = 3 * time.Second
	}
	for p, n := range map[*int]int{&c.Sessions: 20, &c.Watchers: 3, &c.Trials: 1} {
		if *p == 0 {
			*p = n
		}
	}
	for p, d := range map[*time.Duration]time.Duration{
		&c.Store.WatchSilenceTimeout: c.TTL / 2, &c.Store.ProbeTimeout: 500 * time.Millisecond, &c.Store.RequestTimeout: c.TTL,
	} {
		if *p == 0 {
			*p = d
		}
	}
	defaultHarness(&c.Network, &c.Log, &c.Progress)
	return c
}

// defaultHarness fills in what a drill's configuration leaves out of its
// surroundings: members on loopback, no log, no progress.
func defaultHarness(network *func() (*etcdproc.Network, error), log **slog.Logger, progress *io.Writer) {
	if *network == nil {
		*network = func() (*etcdproc.Network, error) { return etcdproc.Loopback(), nil }
	}
	if *log == nil {
		*log = slog.New(slog.DiscardHandler)
	}
	if *progress == nil {
		*progress = io.Discard
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Members == nil {
		errs = append(errs, errors.New("drill: Config.Members is required"))
	}
	if c.Registrant == nil {
		errs = append(errs, errors.New("drill: Config.Registrant is required"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("drill: Config.Dir is required"))
	}
	if c.TTL != 0 && (c.TTL < 2*time.Second || c.TTL > time.Minute) {
		errs = append(errs, fmt.Errorf("drill: TTL %v outside [2s, 1m] (etcd's minimum lease is 2 s)", c.TTL))
	}
	if c.Sessions < 0 || c.Sessions > 1000 {
		errs = append(errs, fmt.Errorf("drill: %d sessions: want 1 to 1000", c.Sessions))
	}
	if c.Watchers < 0 || c.Watchers > 100 {
		errs = append(errs, fmt.Errorf("drill: %d watchers: want 1 to 100", c.Watchers))
	}
	if c.Trials < 0 || c.Trials > 1000 {
		errs = append(errs, fmt.Errorf("drill: %d trials: want 1 to 1000", c.Trials))
	}
	return errors.Join(errs...)
}

// Result is the outcome of one drill.
type Result struct {
	Drill   string `json:"drill"`
	Members int    `json:"members"`
	// Quorum: the fault left a quorum of members answering; the goals
	// (0 lost, 0 phantom, 0 flaps) apply.
	Quorum bool `json:"quorum"`
	Trials int  `json:"trials"`
	Lost   int  `json:"lost"`
	// Kept counts sessions that reported their lease lost by their own
	// clock (no keep-alive answered for a TTL) and found, recovering, that
	// etcd had kept it: nothing was deleted. Sessions no longer do (they
	// report such a lease unconfirmed): a non-zero Kept is a regression.
	Kept int `json:"kept"`
	// Unconfirmed counts sessions that had no renewal answered for a whole
	// TTL and reported their lease unconfirmed (they kept renewing it; a
	// loss followed only if etcd said it ended, and counts in Lost).
	Unconfirmed int `json:"unconfirmed"`
	// Revoked counts leases etcd ended although their sessions renewed
	// them in time: a resumed etcd leader revokes every lease it believes
	// expired (etcd 3.7 behaviour, see docs/operations.md); the sessions
	// re-register, and watchers ride it out (see Flaps).
	Revoked int `json:"revoked"`
	// Phantom counts watchers that listed a dead registrant past its
	// bound while trailing etcd's own deletion by more than a second.
	Phantom int `json:"phantom"`
	// Late counts watchers that listed a dead registrant past its bound
	// but within a second of etcd's own deletion of its key: etcd's expiry
	// and its delivery under load took the time, not a stuck watch.
	Late  int `json:"late"`
	Flaps int `json:"flaps"`
	// RevokedFlaps counts the flaps that were removals of instances whose
	// lease etcd revoked although it was renewed in time (see Revoked):
	// etcd deleted them, and the removal hold covers such revocations only
	// when five or more leases go at once. They do not count against the
	// goal.
	RevokedFlaps int `json:"revoked_flaps"`
	// Stale counts Stale batches the watchers got (the stale state made
	// visible).
	Stale int `json:"stale"`
	// Converge holds one convergence time per trial.
	Converge []time.Duration `json:"converge_ns"`
	// Removal holds, per trial, the latest time after the victim's death
	// at which a watcher still listed it.
	Removal []time.Duration `json:"removal_ns"`
	// Lag holds, per trial, how long the slowest watcher trailed etcd's
	// deletion of the victim's key.
	Lag []time.Duration `json:"lag_ns"`
	// ExcusedLost and ExcusedFlaps count the lost leases and flaps (not
	// those of revoked leases) of trials on a follower during which the
	// members elected a leader: the goal assumes a steady leader, and a
	// follower's fault moves none unless the machine starves etcd (see the
	// trial's note). Lost and Flaps include them.
	ExcusedLost  int `json:"excused_lost"`
	ExcusedFlaps int `json:"excused_flaps"`
	// Skipped says why the drill did not run (no root for partitions).
	Skipped string `json:"skipped,omitempty"`
	// Notes are remarks of the trials (fault details, events).
	Notes []string `json:"notes,omitempty"`
}

// Met reports whether the drill met its goals (quorum drills: 0 lost,
// 0 phantom, 0 flaps but those of leases etcd revoked though renewed in
// time, RevokedFlaps, and those excused, ExcusedLost and ExcusedFlaps;
// others: 0 phantom).
func (r Result) Met() bool {
	if r.Skipped != "" {
		return false
	}
	if r.Quorum {
		return r.Lost == r.ExcusedLost && r.Phantom == 0 && r.Flaps == r.RevokedFlaps+r.ExcusedFlaps
	}
	return r.Phantom == 0
}

// quantile returns the q-quantile of ds (0 for none).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}

// P50 and Max of the convergence times.
func (r Result) P50() time.Duration { return quantile(r.Converge, 0.5) }

// Max is the longest convergence.
func (r Result) Max() time.Duration { return quantile(r.Converge, 1) }

// WriteTable prints results, one row per drill.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DRILL\tMEMBERS\tQUORUM\tTRIALS\tLOST\tKEPT\tREVOKED\tPHANTOM\tLATE\tFLAPS\tSTALE\tCONVERGE P50\tMAX\tREMOVAL MAX\tLAG MAX\tGOAL")
	for _, r := range results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%d\t-\t0\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\tskipped: %s\n", r.Drill, r.Members, r.Skipped)
			continue
		}
		goal := "met"
		if !r.Met() {
			goal = "MISSED"
		}
		fmt.Fprintf(tw, "%s\t%d\t%v\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t%v\t%v\t%v\t%s\n", r.Drill, r.Members, r.Quorum, r.Trials,
			r.Lost, r.Kept, r.Revoked, r.Phantom, r.Late, r.Flaps, r.Stale, round(r.P50()), round(r.Max()),
			round(quantile(r.Removal, 1)), round(quantile(r.Lag, 1)), goal)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "%s: %s\n", r.Drill, n)
		}
	}
	return nil
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }

// Run runs the named drills (all when none) and returns one result each.
// A drill that cannot run here (a partition without network namespaces)
// has Skipped set; any other failure to run (a member that does not start)
// is an error.
func Run(ctx context.Context, cfg Config, names ...string) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if len(names) == 0 {
		names = All
	}
	for _, n := range names {
		if !slices.Contains(All, n) {
			return nil, fmt.Errorf("drill: unknown drill %q (want one of %s)", n, strings.Join(All, ", "))
		}
	}
	r := &runner{cfg: cfg}
	defer r.close()
	var results []Result
	for _, name := range All {
		if !slices.Contains(names, name) {
			continue
		}
		res, err := r.run(ctx, name)
		if err != nil {
			return results, fmt.Errorf("drill %s: %w", name, err)
		}
		results = append(results, res)
	}
	return results, nil
}
