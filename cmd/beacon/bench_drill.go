package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/beaconplane/beacon/internal/lab/drill"
	"github.com/spf13/cobra"
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

func init() {
	var (
		cfg    = bench.DrillConfig{Self: func(args ...string) *exec.Cmd { return selfCommand(args...) }}
		drills string
		output string
	)
	cmd := &cobra.Command{
		Use:   "drill",
		Short: "Fault drills on a real 3-member cluster: hung member, partition, slow disk, leader kill, outages",
		Long: `Runs fault drills against the registry on real clusters of processes: by
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
also on failure.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkBenchOutput(output); err != nil {
				return err
			}
			switch {
			case drills != "":
				cfg.Drills = strings.Split(drills, ",")
			case cmd.Flags().Changed("drills"):
				cfg.Drills = nil // --drills "": only the expiry measurement
			default:
				cfg.Drills = append(slices.Clone(drill.All), bench.DrillLease)
			}
			logger, err := newLogger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cfg.Logger = logger
			cfg.Progress = cmd.ErrOrStderr()
			if err := cfg.Validate(); err != nil {
				return usage(err)
			}
			rep, err := bench.RunDrill(cmd.Context(), cfg)
			if output == "json" {
				if jerr := writeDrillJSON(cmd.OutOrStdout(), rep); jerr != nil {
					return jerr
				}
				return err
			}
			if len(rep.Drills) > 0 {
				if terr := drill.WriteTable(cmd.OutOrStdout(), rep.Drills); terr != nil {
					return terr
				}
			}
			if len(rep.Lease) > 0 {
				fmt.Fprintln(cmd.OutOrStdout())
				if terr := drill.WriteLeaseTable(cmd.OutOrStdout(), rep.Lease); terr != nil {
					return terr
				}
			}
			if len(rep.Expiry) > 0 {
				fmt.Fprintln(cmd.OutOrStdout())
				if terr := drill.WriteExpiryTable(cmd.OutOrStdout(), rep.Expiry); terr != nil {
					return terr
				}
			}
			return err
		},
	}
	f := cmd.Flags()
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
	f.StringVarP(&output, "output", "o", "table", "table or json")
	allowEmpty(cmd, "drills", "none (with --expiry)")
	allowZero(cmd, "expiry", "skip")
	benchCmd.AddCommand(cmd)

	reg := &cobra.Command{
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
	}
	benchCmd.AddCommand(reg)
}

// writeDrillJSON prints the results with durations in milliseconds.
func writeDrillJSON(w io.Writer, rep bench.DrillReport) error {
	type row struct {
		drill.Result
		ConvergeP50Ms float64 `json:"converge_p50_ms"`
		ConvergeMaxMs float64 `json:"converge_max_ms"`
		Met           bool    `json:"met"`
	}
	type leaseRow struct {
		drill.LeaseResult
		TTLSeconds float64 `json:"ttl_seconds"`
		MaxGapMs   float64 `json:"max_gap_ms"`
		Met        bool    `json:"met"`
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
		out.Lease = append(out.Lease, leaseRow{LeaseResult: r, TTLSeconds: r.TTL.Seconds(), MaxGapMs: ms(r.MaxGap), Met: r.Met()})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
