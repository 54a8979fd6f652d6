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
// answering it carries on; with one stopped it ends once the sweep leaves
// that one out, and while it is out; with every member stopped (nowhere
// better to go) it carries on; once they are back it carries on again.
func TestBeforeSilentEndsAWatchOnlyWhenAMemberIsLeftOut(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{})
	ms := c.Members()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Open(ctx, Config{Endpoints: c.Endpoints(), ProbeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	carriesOnWhileAllAnswer(ctx, t, s)

	if err := ms[1].Pause(); err != nil {
		t.Fatal(err)
	}
	// A sweep may outlast beforeSilent's bound, or find no member
	// answering in time on a busy machine (then it leaves none out): ask
	// again until one leaves the stopped member out.
	for {
		changed := s.ExcludedChanged()
		if len(s.Excluded()) > 0 {
			break
		}
		s.beforeSilent(ctx)
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the stopped member was not left out")
		default:
		}
	}
	if got := s.Excluded(); len(got) != 1 || got[0] != ms[1].ClientURL {
		t.Fatalf("left out %v, want %s", got, ms[1].ClientURL)
	}
	if s.beforeSilent(ctx) {
		t.Fatal("a member left out: the watch carries on")
	}
	if err := ms[1].Resume(); err != nil {
		t.Fatal(err)
	}
	carriesOnWhileAllAnswer(ctx, t, s)

	for _, m := range ms {
		if err := m.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	if !s.beforeSilent(ctx) {
		t.Fatal("no member answers (nowhere better to go): the watch ends")
	}
	for _, m := range ms {
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
