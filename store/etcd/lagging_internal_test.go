package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
)

// TestBeforeSilentEndsAWatchOnlyWhenAMemberIsLeftOut: a silent watch
// carries on (etcd is taken for lagging) unless the probe leaves a member
// out, so that the next watch goes to one that answers. With every member
// answering it carries on; with one stopped (the leader) it ends once the
// sweep leaves that one out, and while it is out; with every member
// stopped (nowhere better to go) it carries on; once they are back it
// carries on again.
func TestBeforeSilentEndsAWatchOnlyWhenAMemberIsLeftOut(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Open(ctx, Config{Endpoints: c.Endpoints(), ProbeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	carriesOnWhileAllAnswer(ctx, t, s)

	// The leader is stopped: the hardest case, as the others cannot answer
	// a linearizable read until they elect another.
	stopped := etcdtest.WaitProcessLeader(t, c, time.Minute)
	if err := stopped.Pause(); err != nil {
		t.Fatal(err)
	}
	// A sweep may outlast beforeSilent's bound, or find no member
	// answering in time on a busy machine (then it leaves none out): ask
	// again until one leaves the stopped member out. A follower's probe also
	// times out until the others elect a leader, and a sweep then rightly
	// leaves it out too: wait for the prober to put it back, until only the
	// stopped member is out.
	for {
		changed := s.ExcludedChanged()
		got := s.Excluded()
		if len(got) == 1 && got[0] == stopped.ClientURL {
			break
		}
		if len(got) == 0 {
			s.beforeSilent(ctx)
		} else {
			t.Logf("left out %v; waiting until only %s is", got, stopped.ClientURL)
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("left out %v, want only %s", got, stopped.ClientURL)
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the stopped member was not left out")
		}
	}
	if s.beforeSilent(ctx) {
		t.Fatal("a member left out: the watch carries on")
	}
	if err := stopped.Resume(); err != nil {
		t.Fatal(err)
	}
	carriesOnWhileAllAnswer(ctx, t, s)

	for _, m := range c.Members() {
		if err := m.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	if !s.beforeSilent(ctx) {
		t.Fatal("no member answers (nowhere better to go): the watch ends")
	}
	for _, m := range c.Members() {
		if err := m.Resume(); err != nil {
			t.Fatal(err)
		}
	}
}

// carriesOnWhileAllAnswer checks that a silent watch carries on while
// every member answers. A sweep on a busy machine may find a member slow
// (one just resumed still catches up: its linearizable read waits) and
// leave it out, rightly; then the test waits until the prober puts it back
// and asks again, until a sweep finds every member answering.
func carriesOnWhileAllAnswer(ctx context.Context, t *testing.T, s *Store) {
	t.Helper()
	for {
		waitNoneOut(ctx, t, s)
		if s.beforeSilent(ctx) {
			return
		}
		if len(s.Excluded()) == 0 {
			t.Fatal("every member answers: the watch ends")
		}
		t.Logf("a sweep left %v out; waiting until it answers again", s.Excluded())
	}
}

// waitNoneOut waits for the prober to put every member back.
func waitNoneOut(ctx context.Context, t *testing.T, s *Store) {
	t.Helper()
	for {
		changed := s.ExcludedChanged()
		if len(s.Excluded()) == 0 {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the resumed member was not put back")
		}
	}
}
