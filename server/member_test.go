package server

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/lab/freeport"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestAbsentFromClusterAsksTheMemberList: whether a member was removed is
// read from etcd's member list (not from etcd's log text): a member the
// cluster lists is present, the same one once removed is absent, and a
// cluster that cannot be reached is an error, never "removed".
func TestAbsentFromClusterAsksTheMemberList(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}

	// A member added as a learner (never started; a learner does not
	// count for the quorum, which stays the running member) is listed,
	// and so is the running one.
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	added, err := cli.MemberAddAsLearner(ctx, []string{"http://127.0.0.1:" + strconv.Itoa(port)})
	if err != nil {
		t.Fatal(err)
	}
	self := srv.Etcd().Server.MemberID()
	for _, id := range []uint64{uint64(self), added.Member.ID} {
		if absent, err := absentFromCluster(ctx, id, cfg); err != nil || absent {
			t.Fatalf("member %x, listed: absent=%v, %v", id, absent, err)
		}
	}
	if _, err := cli.MemberRemove(ctx, added.Member.ID); err != nil {
		t.Fatal(err)
	}
	if absent, err := absentFromCluster(ctx, added.Member.ID, cfg); err != nil || !absent {
		t.Fatalf("removed member: absent=%v, %v; want absent", absent, err)
	}

	// Nobody answers: an error, and not absent.
	srv.Stop()
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if absent, err := absentFromCluster(short, uint64(self), cfg); err == nil || absent {
		t.Fatalf("unreachable cluster: absent=%v, %v; want an error", absent, err)
	}
}

// TestMemberRemovedWhileStoppedSaysSoAtItsNextStart: a member removed
// from its cluster while it was stopped has no record of its removal; it
// learns it from its peers at its next start, and etcd then stops it
// without telling any caller (before, Beacon read it in etcd's log text).
// Start says it was removed and what to do, from the other members'
// member list.
func TestMemberRemovedWhileStoppedSaysSoAtItsNextStart(t *testing.T) {
	cfgs := make([]Config, 3)
	var cluster []string
	for i, name := range []string{"r1", "r2", "r3"} {
		cfgs[i] = testConfig(t)
		cfgs[i].Name = name
		cluster = append(cluster, name+"="+cfgs[i].ListenPeerURLs[0])
	}
	for i := range cfgs {
		cfgs[i].InitialCluster = strings.Join(cluster, ",")
	}
	servers := startServers(t, cfgs...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := servers[2].member.etcd.Server.MemberID()
	if err := servers[2].Close(); err != nil {
		t.Fatal(err)
	}
	// etcd refuses to remove a member until the others have been
	// connected for 5 s (ErrUnhealthy): there is no event to wait on.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := servers[0].EtcdClient().MemberRemove(ctx, uint64(id))
		if err == nil {
			break
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) {
			t.Fatal(err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("member remove: %v", err)
		}
	}
	again, err := New(cfgs[2])
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	err = again.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "this member (r3, ID "+id.String()+") was removed from its cluster") {
		t.Fatalf("start of the member removed while stopped: %v, want it to say it was removed", err)
	}
}
