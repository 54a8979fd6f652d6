package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/etcdproc"
	"github.com/beaconplane/beacon/internal/testpeer"
)

// MemberPkg is the package of the etcd 3.7.3 member binary that process
// clusters run (built once per test process by testpeer.GoBuild).
const MemberPkg = "github.com/beaconplane/beacon/internal/etcd"

// ProcessClusterOptions configure StartProcessCluster.
type ProcessClusterOptions struct {
	// Netns puts each member in a network namespace of its own, so that
	// members can be partitioned away. It needs root and iproute2: without
	// them the test is skipped with the reason, or failed when
	// BEACON_REQUIRE_PEERS is set (CI runs as root).
	Netns bool
	// Fsync makes members sync their WAL (off by default: faster on a
	// shared disk).
	Fsync bool
}

// StartProcessCluster starts an n-member cluster of real etcd 3.7.3
// processes (see package etcdproc: Pause, Resume, Kill, Restart, Partition
// and Heal per member) and kills it, removing its namespaces, when the test
// ends. Member logs are printed if the test failed.
func StartProcessCluster(tb testing.TB, n int, opts ProcessClusterOptions) *etcdproc.Cluster {
	tb.Helper()
	nw := etcdproc.Loopback()
	if opts.Netns {
		var err error
		if nw, err = etcdproc.Netns(); err != nil {
			if errors.Is(err, etcdproc.ErrNetnsUnavailable) {
				testpeer.Missing(tb, fmt.Sprintf("%v (this drill partitions members through network namespaces; CI runs it as root)", err))
			}
			tb.Fatal(err)
		}
	}
	bin := testpeer.GoBuild(tb, MemberPkg)
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	c, err := etcdproc.StartCluster(ctx, etcdproc.EtcdMembers{Bin: bin, NoFsync: !opts.Fsync}, nw, n, tb.TempDir())
	if err != nil {
		nw.Close()
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(func() {
		c.Close()
		if tb.Failed() {
			for _, m := range c.Members() {
				tb.Logf("member %s log (last lines):\n%s", m.Name, lastLines(m.Log(), 40))
			}
		}
	})
	return c
}

// WaitProcessLeader waits until the cluster has a leader and returns it.
func WaitProcessLeader(tb testing.TB, c *etcdproc.Cluster, within time.Duration) *etcdproc.Member {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	m, err := c.WaitLeader(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
