package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
)

// TestBeforeSilentSaysLaggingOnlyWhenEveryMemberAnswers: a silent watch is
// taken for etcd lagging (and carries on) only when the probe finds every
// member answering with a leader. With one member stopped it is not — the
// sweep leaves that member out — nor on the next silence while it is out
// (a silent watch may still be on it), and it is again once the member is
// back.
func TestBeforeSilentSaysLaggingOnlyWhenEveryMemberAnswers(t *testing.T) {
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
	answering(ctx, t, s, "every member answers: not taken for lag")
	if err := ms[1].Pause(); err != nil {
		t.Fatal(err)
	}
	if s.beforeSilent(ctx) {
		t.Fatal("a member stopped: taken for lag")
	}
	// A sweep may outlast beforeSilent's bound, or find no member
	// answering in time on a busy machine (then it leaves none out): ask
	// again until one leaves the stopped member out.
	for {
		changed := s.ExcludedChanged()
		if len(s.Excluded()) > 0 {
			break
		}
		select {
		case <-changed:
		case <-s.prober.suspect():
		case <-ctx.Done():
			t.Fatal("the stopped member was not left out")
		}
	}
	if got := s.Excluded(); len(got) != 1 || got[0] != ms[1].ClientURL {
		t.Fatalf("left out %v, want %s", got, ms[1].ClientURL)
	}
	if s.beforeSilent(ctx) {
		t.Fatal("a member left out: taken for lag")
	}
	if err := ms[1].Resume(); err != nil {
		t.Fatal(err)
	}
	for {
		changed := s.ExcludedChanged()
		if len(s.Excluded()) == 0 {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the resumed member was not put back")
		}
	}
	answering(ctx, t, s, "every member answers again: not taken for lag")
}

// answering waits for beforeSilent to take a silence for lag: a probe may
// time out on a busy machine even while every member answers, but the
// sweeps that follow must find them all.
func answering(ctx context.Context, t *testing.T, s *Store, msg string) {
	t.Helper()
	for !s.beforeSilent(ctx) {
		if ctx.Err() != nil {
			t.Fatal(msg)
		}
	}
}
