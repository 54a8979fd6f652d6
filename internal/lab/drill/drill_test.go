package drill_test

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/lab/drill"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

var (
	trials   = flag.Int("drill.trials", 1, "trials per drill (member-hang and partition run at least 2: a follower and the leader)")
	sessions = flag.Int("drill.sessions", 20, "steady sessions (each a registry with a client of its own)")
	only     = flag.String("drill.run", "", "comma-separated drills to run (default: all)")
	logs     = flag.Bool("drill.log", false, "print the registries' and stores' warnings")
	keep     = flag.String("drill.dir", "", "keep the members' data and logs in this directory")
	etcdLog  = flag.String("drill.etcd-log", "warn", "the members' --log-level")
)

func TestMain(m *testing.M) {
	if drill.IsRegistrant() {
		os.Exit(drill.RegistrantMain(os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestDrills runs every drill on real etcd 3.7.3 member processes — in
// network namespaces when run as root (CI), so that the partition drill
// runs too — and checks the goals: while quorum holds, no steady session
// loses its lease, no watcher lists a dead registrant beyond its bound, and
// no watcher sees a live instance removed; in outages, no phantom either.
// Run with -v to see the figures; -drill.trials for more trials.
func TestDrills(t *testing.T) {
	if testing.Short() {
		t.Skip("drills take about two minutes")
	}
	machine.Exclusive(t)
	bin := testpeer.GoBuild(t, etcdtest.MemberPkg)
	network := func() (*etcdproc.Network, error) { return etcdproc.Netns() }
	if nw, err := etcdproc.Netns(); err != nil {
		if !errors.Is(err, etcdproc.ErrNetnsUnavailable) || os.Getenv(testpeer.RequireEnv) != "" {
			t.Fatal(err)
		}
		t.Logf("members on loopback, the partition drill is skipped: %v", err)
		network = func() (*etcdproc.Network, error) { return etcdproc.Loopback(), nil }
	} else {
		nw.Close()
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := *keep
	if dir == "" {
		dir = t.TempDir()
	}
	var progress strings.Builder
	cfg := drill.Config{
		Members:    etcdproc.EtcdMembers{Bin: bin, NoFsync: true, LogLevel: *etcdLog},
		Network:    network,
		Dir:        dir,
		Registrant: func() *exec.Cmd { return testpeer.Command(exe, "-test.run=^$") },
		Trials:     *trials,
		Sessions:   *sessions,
		Progress:   &progress,
	}
	if *logs {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	var names []string
	if *only != "" {
		names = strings.Split(*only, ",")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	results, err := drill.Run(ctx, cfg, names...)
	var table strings.Builder
	_ = drill.WriteTable(&table, results)
	t.Logf("drills:\n%s\n%s", progress.String(), table.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		switch {
		case r.Skipped != "":
			// Shown as a skipped subtest with the reason (it was only
			// logged: TestDrills passed with a drill not run), and a
			// failure under BEACON_REQUIRE_PEERS.
			t.Run(r.Drill, func(t *testing.T) { testpeer.Missing(t, r.Drill+" did not run: "+r.Skipped) })
		case !r.Met():
			t.Errorf("%s missed its goal: lost %d, phantom %d, flaps %d (quorum %v)", r.Drill, r.Lost, r.Phantom, r.Flaps, r.Quorum)
		}
	}
}

var expiryN = flag.Int("drill.expiry", 2000, "instances left to expire in TestExpiryThroughput")

// TestExpiryThroughput lets drill.expiry instances expire at once in both
// lease layouts on a real etcd 3.7 member and prints the figures: Beacon's
// sessions (one lease per process for all its instances) against one lease
// per instance, which etcd revokes at its fixed pace (1,000 leases/s).
func TestExpiryThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("writes thousands of keys")
	}
	machine.Exclusive(t)
	bin := testpeer.GoBuild(t, etcdtest.MemberPkg)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results, err := drill.MeasureExpiry(ctx, drill.Config{
		Members:    etcdproc.EtcdMembers{Bin: bin, NoFsync: true},
		Dir:        t.TempDir(),
		Registrant: func() *exec.Cmd { return testpeer.Command(exe, "-test.run=^$") },
	}, *expiryN, 10)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	_ = drill.WriteExpiryTable(&table, results)
	t.Logf("expiry of %d instances:\n%s", *expiryN, table.String())
	for _, r := range results {
		if r.Revisions > r.Leases {
			t.Errorf("%s: deletions in %d revisions for %d leases (a lease's keys go in one revision)", r.Layout, r.Revisions, r.Leases)
		}
	}
}

// TestMetCountsRevokedFlapsApart: removals of live instances count against
// a quorum drill's goal unless etcd deleted them by revoking leases their
// sessions renewed in time (a resumed etcd 3.7 leader revokes the leases it
// believes expired; fewer than five at once are not held back by the
// watchers, so they show as a removal and a re-add). A member-hang trial
// in which the resumed leader revoked 4 of 20 leases showed 16 such flaps
// and reported the drill MISSED. Those excused (a follower's trial during
// which the members elected a leader) do not count either; a phantom
// always does.
func TestMetCountsRevokedFlapsApart(t *testing.T) {
	for _, c := range []struct {
		r    drill.Result
		want bool
	}{
		{drill.Result{Quorum: true, Revoked: 4, Flaps: 16, RevokedFlaps: 16}, true},
		{drill.Result{Quorum: true, Revoked: 4, Flaps: 17, RevokedFlaps: 16}, false},
		{drill.Result{Quorum: true, Flaps: 1}, false},
		{drill.Result{Quorum: true, Lost: 1, Flaps: 4, RevokedFlaps: 4}, false},
		{drill.Result{Quorum: false, Flaps: 100}, true},
		// A follower's trial during which the members elected a leader.
		{drill.Result{Quorum: true, Lost: 1, Flaps: 1, ExcusedLost: 1, ExcusedFlaps: 1}, true},
		{drill.Result{Quorum: true, Lost: 2, Flaps: 1, ExcusedLost: 1, ExcusedFlaps: 1}, false},
		{drill.Result{Quorum: true, Lost: 1, Flaps: 2, ExcusedLost: 1, ExcusedFlaps: 1}, false},
		{drill.Result{Quorum: true, Lost: 1, Flaps: 1, Phantom: 1, ExcusedLost: 1, ExcusedFlaps: 1}, false},
	} {
		if got := c.r.Met(); got != c.want {
			t.Errorf("%+v: Met() = %v, want %v", c.r, got, c.want)
		}
	}
}

// TestLeaseGoalIsVoidOnlyForALateElection: an asserted lease result that
// lost leases misses the goal, unless the members went without a leader
// for longer than the election the TTL is derived for, or elected one
// during a follower's fault; a false loss misses it whatever the election
// took.
func TestLeaseGoalIsVoidOnlyForALateElection(t *testing.T) {
	late := drill.ElectionBudget + time.Second
	for _, c := range []struct {
		r         drill.LeaseResult
		met, void bool
	}{
		{drill.LeaseResult{Asserted: true, Leases: 8}, true, false},
		{drill.LeaseResult{Asserted: true, Leases: 8, LeaderGap: late}, true, false},
		{drill.LeaseResult{Asserted: true, Leases: 8, Lost: 1, LeaderGap: drill.ElectionBudget}, false, false},
		{drill.LeaseResult{Asserted: true, Leases: 8, Lost: 1, LeaderGap: late}, false, true},
		{drill.LeaseResult{Asserted: true, Leases: 8, Lost: 1, FalseLoss: 1, LeaderGap: late}, false, false},
		{drill.LeaseResult{Asserted: false, Leases: 8, Lost: 8, LeaderGap: late}, true, false},
		{drill.LeaseResult{Asserted: true, Skipped: "no netns"}, false, false},
		{drill.LeaseResult{Role: "follower", Asserted: true, Leases: 8, Lost: 8, Elections: 1}, false, true},
		{drill.LeaseResult{Role: "follower", Asserted: true, Leases: 8, Lost: 8}, false, false},
		{drill.LeaseResult{Role: "follower", Asserted: true, Leases: 8, Lost: 8, Elections: -1}, false, false},
		{drill.LeaseResult{Role: "follower", Asserted: true, Leases: 8, Lost: 8, FalseLoss: 1, Elections: 1}, false, false},
		{drill.LeaseResult{Role: "leader", Asserted: true, Leases: 8, Lost: 1, Elections: 1, LeaderGap: drill.ElectionBudget}, false, false},
	} {
		if got := c.r.Met(); got != c.met {
			t.Errorf("%+v: Met() = %v, want %v", c.r, got, c.met)
		}
		if got := c.r.Void() != ""; got != c.void {
			t.Errorf("%+v: Void() = %q, want void %v", c.r, c.r.Void(), c.void)
		}
	}
}

var leaseFaults = flag.String("drill.lease-faults", "", "comma-separated faults of TestLeaseDrills (default: all)")

// TestLeaseDrills runs the lease drills: every path that keeps a lease
// alive (Go sessions, `beacon register` processes, HTTP registrations
// through `beacon serve --etcd-endpoints`, etcd clients through `beacon
// proxy`) through each kind of member fault (stopped, cut off, slow disk,
// killed), on a follower and on the leader of 3 etcd 3.7.3 processes (the
// slow-disk build, in network namespaces when run as root, as CI does). The
// goal: no lease lost at 3 s for a follower fault, nor at
// registry.MinElectionTTL for a leader fault. It takes about three
// minutes; -v prints the table.
func TestLeaseDrills(t *testing.T) {
	if testing.Short() {
		t.Skip("lease drills take about three minutes")
	}
	machine.Exclusive(t)
	members := etcdproc.EtcdMembers{Bin: etcdtest.SlowDiskMemberBin(t), FsyncDelay: true, LogLevel: *etcdLog}
	beaconBin := testpeer.GoBuild(t, "github.com/beaconplane/beacon/cmd/beacon")
	network := func() (*etcdproc.Network, error) { return etcdproc.Netns() }
	if nw, err := etcdproc.Netns(); err != nil {
		if !errors.Is(err, etcdproc.ErrNetnsUnavailable) || os.Getenv(testpeer.RequireEnv) != "" {
			t.Fatal(err)
		}
		t.Logf("members on loopback, the black-hole fault is skipped: %v", err)
		network = func() (*etcdproc.Network, error) { return etcdproc.Loopback(), nil }
	} else {
		nw.Close()
	}
	dir := *keep
	if dir == "" {
		dir = t.TempDir()
	}
	var progress strings.Builder
	cfg := drill.LeaseConfig{
		Members:  members,
		Network:  network,
		Dir:      dir,
		Beacon:   func(args ...string) *exec.Cmd { return testpeer.Command(beaconBin, args...) },
		Progress: &progress,
	}
	if *leaseFaults != "" {
		cfg.Faults = strings.Split(*leaseFaults, ",")
	}
	warnings := &syncbuf.Buffer{} // printed if the drills fail
	var logOut io.Writer = warnings
	if *logs {
		logOut = os.Stderr
	}
	cfg.Log = slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	defer func() {
		if t.Failed() {
			t.Logf("the sessions' last warnings:\n%s", lastLines(warnings.String(), 40))
			for _, f := range []string{"serve.log", "proxy.log"} {
				b, _ := os.ReadFile(filepath.Join(dir, "lease", f))
				t.Logf("%s, last lines:\n%s", f, lastLines(string(b), 40))
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	results, err := drill.RunLease(ctx, cfg)
	var table strings.Builder
	_ = drill.WriteLeaseTable(&table, results)
	t.Logf("lease drills:\n%s\n%s", progress.String(), table.String())
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]bool{}
	for _, r := range results {
		switch {
		case r.Skipped != "":
			if os.Getenv(testpeer.RequireEnv) != "" {
				t.Errorf("%s on the %s did not run: %s", r.Fault, r.Role, r.Skipped)
			}
		case r.Void() != "":
			t.Logf("%s on the %s: %d of %d %s leases at TTL %v lost; the goal is void: %s", r.Fault, r.Role, r.Lost, r.Leases, r.Path, r.TTL, r.Void())
			ran[r.Path] = true
		case !r.Met():
			t.Errorf("%s on the %s: %d of %d %s leases at TTL %v lost (%d reported lost while etcd held them)",
				r.Fault, r.Role, r.Lost, r.Leases, r.Path, r.TTL, r.FalseLoss)
		default:
			ran[r.Path] = true
		}
	}
	for _, p := range []string{drill.PathSession, drill.PathRegister, drill.PathHTTP, drill.PathProxy} {
		if !ran[p] {
			t.Errorf("no lease drill ran the %s path", p)
		}
	}
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
