package etcdtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestSlowDiskMember: a member of the slow-disk build whose fsync delay is
// set waits that long in every WAL sync — etcd itself reports it (its
// "slow fdatasync" warning, logged from 1 s) — and a member of the plain
// build refuses the delay with a reason.
func TestSlowDiskMember(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a 3-member cluster of etcd processes")
	}
	c := StartProcessCluster(t, 3, ProcessClusterOptions{SlowDisk: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	slow := c.Members()[2]
	if err := slow.SetFsyncDelay(1100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// Every write is a WAL sync on every member: write until the slow one
	// says so (the delay file is read within 20 ms of being set).
	for !strings.Contains(slow.Log(), "slow fdatasync") {
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never reported a slow fdatasync; its log:\n%s", slow.Name, lastLines(slow.Log(), 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := slow.SetFsyncDelay(0); err != nil {
		t.Fatal(err)
	}

	plain := StartProcessCluster(t, 1, ProcessClusterOptions{})
	if err := plain.Members()[0].SetFsyncDelay(time.Second); !errors.Is(err, etcdproc.ErrNoFsyncDelay) {
		t.Fatalf("SetFsyncDelay on a plain member: %v, want ErrNoFsyncDelay", err)
	}
}
