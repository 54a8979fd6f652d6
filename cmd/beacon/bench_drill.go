package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/beaconplane/beacon/internal/lab/drill"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// selfCommand returns the command that runs this beacon binary with args
// (the drill's serve nodes and registrants). Tests replace it: their
// binary runs main only when told so.
var selfCommand = func(args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return exec.Command(exe, args...)
}

// drillHelp is the help of beacon bench drill.
const drillHelp = `Runs fault drills against the registry on real clusters of processes: by
default this binary's own "beacon serve" nodes (embedded etcd 3.7.3) that form
their cluster through a discovery token served by one more "beacon serve", or,
with --etcd-bin, members of an etcd binary. Each drill keeps --sessions
registrants alive (one client each) and --watchers watchers, and every trial
kills a registrant process with SIGKILL while it injects its fault:

  sigkill         nothing else (the cluster is healthy)
  single-pause    a 1-member cluster stopped (SIGSTOP) for 2 TTL
  single-restart  a 1-member cluster killed, restarted after 2 TTL
  leader-kill     the leader of 3 killed, restarted after 2 TTL
  member-hang     a follower, then the leader, of 3 stopped for 2 TTL
  partition       a follower, then the leader, of 3 cut off (link down) for 2 TTL
  compaction      a watcher cut off while instances die, move and join and
                  etcd compacts its history
  slow-consumer   a watcher that sits on a batch while 1,000 changes happen
  lease           every path that keeps a lease alive — Go sessions, "beacon
                  register" processes, HTTP registrations through a "beacon
                  serve --etcd-endpoints", etcd clients through a "beacon
                  proxy" — while a follower, then the leader, is stopped, cut
                  off, given a slow disk or killed, each for 2 TTL (see below)

and prints, per drill: trials, lost leases, phantoms (a dead registrant still
listed after TTL + 1 s, counted from the fault's end in outages or from a new
leader's takeover, which extends every lease), flaps (removals of live
instances seen by watchers), stale batches, and convergence p50/max. Goal while
quorum holds: 0 lost, 0 phantom, 0 flaps (a removal of an instance whose lease
etcd revoked although it was renewed in time, as a resumed etcd leader does, is
etcd's deletion: noted, not counted against the goal).

The lease drills print, per fault, member, path and TTL: leases lost (ended
for want of a renewal, given up by their keeper, or reported lost while etcd
held them), revoked (ended by etcd although renewed in time: a resumed etcd
leader revokes those it believes expired), sessions that reported their lease
unconfirmed, failed renewals and the longest gap between answered renewals.
Every path keeps leases of 3 s (the goal for a follower fault: 0 lost), of
5 s (the shortest TTL that rides out an election: the goal for a leader
fault) and of --lease-ttls. The slow-disk fault needs --etcd-bin to be the
slow-disk build of etcd ("bash .ci/build-peers etcd-slowdisk" builds it into
~/.cache/beacon-peers/bin/etcd-slowdisk); with other members it is skipped
with the reason.

With --expiry N it also lets N instances expire at once in two lease layouts
— Beacon's sessions (one lease per process, --expiry-processes processes) and
one lease per instance — and measures how fast etcd deletes them (etcd revokes
1,000 leases per second; a lease's keys go in one revision). --drills ""
--expiry N runs only that.

Partitions need members in network namespaces (root and iproute2); with --net
auto (the default) the drill uses them when it can and otherwise says why the
partition drill is skipped. Every process and namespace is removed at the end,
also on failure.`

func init() {
	var (
		cfg    = bench.DrillConfig{Self: func(args ...string) *exec.Cmd { return selfCommand(args...) }}
		drills string
	)
	cmd := addBenchScenario(benchScenario{
		use:   "drill",
		short: "Fault drills on a real 3-member cluster: hung member, partition, slow disk, leader kill, outages",
		long:  drillHelp,
		flags: func(f *pflag.FlagSet) {
			f.StringVar(&drills, "drills", "", "comma-separated drills to run (default: all, lease included; \"\" with --expiry: none)")
			f.DurationSliceVar(&cfg.LeaseTTLs, "lease-ttls", []time.Duration{2 * time.Second, 4 * time.Second},
				"TTLs the lease drills' keepers also use, besides 3s and 5s (measured, not asserted)")
			f.DurationVar(&cfg.FsyncDelay, "fsync-delay", 500*time.Millisecond, "the lease drills' slow disk: delay of every WAL sync")
			f.IntVar(&cfg.Expiry, "expiry", 0, "also let this many instances expire at once in both lease layouts (0: skip)")
			f.IntVar(&cfg.ExpiryProcesses, "expiry-processes", 10, "processes holding Beacon's instances in the expiry measurement")
			f.IntVar(&cfg.Trials, "trials", 10, "trials per drill (member-hang and partition run at least 2)")
			f.IntVar(&cfg.Sessions, "sessions", 100, "steady registrants, each with a client of its own")
			f.IntVar(&cfg.Watchers, "watchers", 4, "watchers, each with a client of its own")
			f.DurationVar(&cfg.TTL, "ttl", 3*time.Second, "lease TTL of every session")
			f.StringVar(&cfg.EtcdBin, "etcd-bin", "", "run members from this etcd binary instead of beacon serve nodes")
			f.StringVar(&cfg.Network, "net", bench.DrillNetAuto, "auto, netns (members in network namespaces: root, iproute2) or loopback")
			f.StringVar(&cfg.Dir, "dir", "", "keep the members' data and logs here (default: a temporary directory, removed)")
		},
		prepare: func(cmd *cobra.Command) error {
			switch {
			case drills != "":
				cfg.Drills = strings.Split(drills, ",")
			case cmd.Flags().Changed("drills"):
				cfg.Drills = nil // --drills "": only the expiry measurement
			default:
				cfg.Drills = append(slices.Clone(drill.All), bench.DrillLease)
			}
			cfg.Progress = cmd.ErrOrStderr()
			return usage(cfg.Validate())
		},
		run: func(ctx context.Context, logger *slog.Logger) (benchReport, error) {
			cfg.Logger = logger
			rep, err := bench.RunDrill(ctx, cfg)
			return drillReport(rep), err // printed also after a failure
		},
	})
	allowEmpty(cmd, "drills", "none (with --expiry)")
	allowZero(cmd, "expiry", "skip")

	benchCmd.AddCommand(&cobra.Command{
		Use:    "drill-registrant",
		Short:  "Child of bench drill: a registrant killed by the drill",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if code := drill.RegistrantMain(cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()); code != 0 {
				return fmt.Errorf("drill registrant failed (exit %d)", code)
			}
			return nil
		},
	})
}

// drillReport prints the drills' results: a table for each part that ran,
// or one JSON document.
type drillReport bench.DrillReport

// WriteTable prints a table per part: the drills, the lease drills and the
// expiry measurement.
func (rep drillReport) WriteTable(w io.Writer) error {
	if len(rep.Drills) > 0 {
		if err := drill.WriteTable(w, rep.Drills); err != nil {
			return err
		}
	}
	if len(rep.Lease) > 0 {
		fmt.Fprintln(w)
		if err := drill.WriteLeaseTable(w, rep.Lease); err != nil {
			return err
		}
	}
	if len(rep.Expiry) > 0 {
		fmt.Fprintln(w)
		if err := drill.WriteExpiryTable(w, rep.Expiry); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints the results with durations in milliseconds.
func (rep drillReport) WriteJSON(w io.Writer) error {
	type row struct {
		drill.Result
		ConvergeP50Ms float64 `json:"converge_p50_ms"`
		ConvergeMaxMs float64 `json:"converge_max_ms"`
		Met           bool    `json:"met"`
	}
	type leaseRow struct {
		drill.LeaseResult
		TTLSeconds  float64 `json:"ttl_seconds"`
		MaxGapMs    float64 `json:"max_gap_ms"`
		LeaderGapMs float64 `json:"leader_gap_ms"`
		Met         bool    `json:"met"`
		Void        string  `json:"void,omitempty"`
	}
	out := struct {
		Scenario string               `json:"scenario"`
		Drills   []row                `json:"drills"`
		Lease    []leaseRow           `json:"lease,omitempty"`
		Expiry   []drill.ExpiryResult `json:"expiry,omitempty"`
	}{Scenario: "drill", Expiry: rep.Expiry}
	for _, r := range rep.Drills {
		out.Drills = append(out.Drills, row{Result: r, ConvergeP50Ms: ms(r.P50()), ConvergeMaxMs: ms(r.Max()), Met: r.Met()})
	}
	for _, r := range rep.Lease {
		out.Lease = append(out.Lease, leaseRow{LeaseResult: r, TTLSeconds: r.TTL.Seconds(), MaxGapMs: ms(r.MaxGap),
			LeaderGapMs: ms(r.LeaderGap), Met: r.Met(), Void: r.Void()})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
