package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// MemberPkg is the package of the etcd 3.7.3 member binary that process
// clusters run (built once per test process by testpeer.GoBuild).
const MemberPkg = "github.com/beaconplane/beacon/internal/lab/etcd"

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
	// SlowDisk runs the slow-disk build of the member binary
	// (SlowDiskMemberBin), with fsync on, so that Member.SetFsyncDelay
	// works.
	SlowDisk bool
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
	members := etcdproc.EtcdMembers{NoFsync: !opts.Fsync}
	if opts.SlowDisk {
		members = etcdproc.EtcdMembers{Bin: SlowDiskMemberBin(tb), FsyncDelay: true}
	} else {
		members.Bin = testpeer.GoBuild(tb, MemberPkg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	c, err := etcdproc.StartCluster(ctx, members, nw, n, tb.TempDir())
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

// SlowDiskMemberBin builds the slow-disk etcd 3.7.3 member binary (once
// per test process) and returns its path: MemberPkg built with the
// beacon_fsync_delay tag against a copy of etcd's client/pkg module whose
// fileutil/sync_linux.go is internal/lab/etcd/fsyncdelay/sync_linux.go (an
// alternate go.mod replaces the module; the Go toolchain allows no overlay
// of the module cache), so that its WAL syncs wait for the delay
// etcdproc.Member.SetFsyncDelay sets. Run it with
// etcdproc.EtcdMembers{FsyncDelay: true} (and fsync on).
func SlowDiskMemberBin(tb testing.TB) string {
	tb.Helper()
	// A fixed place, so that the Go build cache serves later builds.
	modfile, err := etcdproc.SlowDiskModfile(filepath.Join(testpeer.DefaultPeersDir(), "src", "etcd-slowdisk"))
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	return testpeer.GoBuildWith(tb, "etcd-slowdisk", MemberPkg, "-modfile", modfile, "-tags", etcdproc.FsyncDelayTag)
}
