package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
)

// Faults on a real 3-member etcd 3.7.3 cluster of processes.

const (
	silence = 1500 * time.Millisecond // WatchSilenceTimeout in these tests
	probe   = 500 * time.Millisecond  // ProbeTimeout in these tests
)

// silenceBound is how soon a watch ends after its last sign of life: 1.25
// WatchSilenceTimeout, plus the member probe it waits for (at most two
// probe timeouts), plus scheduling slack on a loaded machine.
const silenceBound = silence*5/4 + 2*probe + 2*time.Second

// TestWatchOnHungMemberEnds: a watch whose only member is stopped (SIGSTOP:
// it accepts connections and answers nothing) ends with ErrWatchSilent
// within its bound, while a quiet watch on a healthy member never does.
func TestWatchOnHungMemberEnds(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{})
	ms := c.Members()
	cfg := etcd.Config{WatchSilenceTimeout: silence, ProbeTimeout: probe}
	hungCfg, quietCfg := cfg, cfg
	hungCfg.Endpoints, quietCfg.Endpoints = []string{ms[0].ClientURL}, []string{ms[1].ClientURL}
	hungStore, quietStore := newStore(t, nil, hungCfg), newStore(t, nil, quietCfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	hungW := hungStore.Watch(ctx, "/hung/", 0)
	quietW := quietStore.Watch(ctx, "/hung/", 0)
	if err := ms[0].Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	defer func() { _ = ms[0].Resume() }()
	select {
	case resp, ok := <-hungW:
		took := time.Since(paused)
		if !ok || !errors.Is(resp.Err, store.ErrWatchSilent) || !errors.Is(resp.Err, store.ErrUnavailable) {
			t.Fatalf("watch on the hung member delivered %+v (open %v), want ErrWatchSilent", resp, ok)
		}
		t.Logf("watch on the hung member ended after %v: %v", took.Round(time.Millisecond), resp.Err)
		if took > silenceBound {
			t.Fatalf("took %v, bound %v", took, silenceBound)
		}
	case <-time.After(3 * silenceBound):
		t.Fatalf("watch on the hung member still open %v after the pause", 3*silenceBound)
	}
	// A watch opened while the member hangs (its gRPC stream never opens)
	// ends the same way.
	late := hungStore.Watch(ctx, "/hung/", 1)
	opened := time.Now()
	select {
	case resp, ok := <-late:
		if !ok || !errors.Is(resp.Err, store.ErrWatchSilent) {
			t.Fatalf("watch opened on the hung member delivered %+v (open %v), want ErrWatchSilent", resp, ok)
		}
		if took := time.Since(opened); took > silenceBound {
			t.Fatalf("watch opened on the hung member ended after %v, bound %v", took, silenceBound)
		}
	case <-time.After(3 * silenceBound):
		t.Fatal("watch opened on the hung member still open")
	}
	// The quiet watch on a healthy member stayed open (progress
	// notifications answered its checks) for as long.
	select {
	case resp, ok := <-quietW:
		t.Fatalf("quiet watch on a healthy member delivered %+v (open %v)", resp, ok)
	default:
	}
}

// TestHungMemberLeftOut: with one member of three stopped, calls that reach
// it time out, the store probes the members and leaves the stopped one
// out, and from then on every call and every new watch goes to the two
// that answer; once it resumes it is put back.
func TestHungMemberLeftOut(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{})
	s := newStore(t, nil, etcd.Config{Endpoints: c.Endpoints(), WatchSilenceTimeout: silence, ProbeTimeout: probe})
	writer := newStore(t, nil, etcd.Config{Endpoints: c.Endpoints()[1:]})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hung := c.Members()[0]

	// Watches spread over the members (each has its own stream).
	var watches []store.WatchChan
	for range 6 {
		watches = append(watches, s.Watch(ctx, "/left/", 0))
	}
	if err := hung.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	defer func() { _ = hung.Resume() }()

	// Short calls: those that land on the stopped member time out, and
	// the first of those has the members probed.
	timeouts := 0
	var leftOut time.Duration
	for i := 0; leftOut == 0; i++ {
		if time.Since(paused) > 30*time.Second { // a deadline, not a measurement
			t.Fatalf("stopped member not left out after %v (%d timeouts): excluded %v", time.Since(paused), timeouts, s.Excluded())
		}
		cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := s.Get(cctx, fmt.Sprintf("/left/k%d", i))
		ccancel()
		if errors.Is(err, store.ErrUnavailable) {
			timeouts++
		} else if !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		if slices.Equal(s.Excluded(), []string{hung.ClientURL}) {
			leftOut = time.Since(paused)
		}
	}
	t.Logf("stopped member left out %v after the pause (%d calls timed out first)", leftOut.Round(time.Millisecond), timeouts)
	// A probe asked for now ends (store.Failover), and leaves it out.
	select {
	case <-s.Probed():
	case <-ctx.Done():
		t.Fatal("a probe asked for did not end")
	}
	if !slices.Equal(s.Excluded(), []string{hung.ClientURL}) {
		t.Fatalf("after a probe, excluded %v; want the stopped member", s.Excluded())
	}
	// From now on (once the client's balancer has applied the new
	// endpoints, a matter of milliseconds: two calls), no call waits for
	// the stopped member.
	for i := range 2 {
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		_, _ = s.Get(wctx, fmt.Sprintf("/left/warm%d", i))
		wcancel()
	}
	for i := range 30 {
		cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := s.Get(cctx, fmt.Sprintf("/left/again%d", i))
		ccancel()
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("call %d after the stopped member was left out: %v", i, err)
		}
	}
	// Every watch either still works or ended as silent (it was on the
	// stopped member); a new watch then works at once.
	rev, err := writer.Put(ctx, "/left/x", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range watches {
		select {
		case resp := <-w:
			if resp.Err != nil {
				if !errors.Is(resp.Err, store.ErrWatchSilent) {
					t.Fatalf("watch %d: %v", i, resp.Err)
				}
				t.Logf("watch %d was on the stopped member: %v", i, resp.Err)
				w = s.Watch(ctx, "/left/", rev)
				resp = <-w
			}
			if resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].Revision() != rev {
				t.Fatalf("watch %d delivered %+v, want /left/x@%d", i, resp, rev)
			}
		case <-time.After(silenceBound):
			t.Fatalf("watch %d delivered nothing within %v of the write", i, silenceBound)
		}
	}
	// Resumed, the member is probed again and put back.
	if err := hung.Resume(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		changed := s.ExcludedChanged()
		if len(s.Excluded()) == 0 {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("resumed member still left out: %v", s.Excluded())
		}
	}
}

// TestWatchSilentWhileDown: while the whole cluster is down (its one
// member killed), a watch does not stay silent: it ends with ErrWatchSilent
// within its bound, so that its caller reports the outage and re-lists once
// etcd is back.
func TestWatchSilentWhileDown(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 1, etcdtest.ProcessClusterOptions{})
	s := newStore(t, nil, etcd.Config{Endpoints: c.Endpoints(), WatchSilenceTimeout: silence})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := s.Watch(ctx, "/down/", 0)
	if err := c.Members()[0].Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case resp, ok := <-w:
		took := time.Since(killed)
		if !ok || !errors.Is(resp.Err, store.ErrWatchSilent) {
			t.Fatalf("watch delivered %+v (open %v), want ErrWatchSilent", resp, ok)
		}
		t.Logf("watch ended %v after etcd was killed: %v", took.Round(time.Millisecond), resp.Err)
		if took > silenceBound {
			t.Fatalf("took %v, bound %v", took, silenceBound)
		}
	case <-time.After(3 * silenceBound):
		t.Fatal("watch still silent")
	}
}

// TestWatchFromNextRevisionOnQuietStore: a watch from the revision after
// a listing, on a store nobody writes to, stays open. etcd answers no
// progress request while its revision is below a watch's start, so such a
// watch used to end as silent every WatchSilenceTimeout (a fresh cluster's
// registry re-listed every 4 s, DNS flapped, v2 discovery waits failed
// after 4 s with 500).
func TestWatchFromNextRevisionOnQuietStore(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t, etcdtest.Options{}) // nobody else writes here
	s := newStore(t, srv, etcd.Config{WatchSilenceTimeout: silence, ProbeTimeout: probe})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, rev, err := s.List(ctx, "/quiet/")
	if err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, "/quiet/", rev+1)
	select {
	case resp := <-w:
		t.Fatalf("watch from revision %d (store at %d) delivered %+v before any write", rev+1, rev, resp)
	case <-time.After(2 * silenceBound): // several silence timeouts
	}
	if _, err := s.Put(ctx, "/quiet/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	select {
	case resp := <-w:
		if resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].KV.Key != "/quiet/k" {
			t.Fatalf("after the write: %+v", resp)
		}
	case <-time.After(silenceBound):
		t.Fatal("the write was not delivered")
	}
}

// TestHungMemberLeftOutBeforeTheProbeTimeout: a member that does not
// answer while the others do is left out a quarter of ProbeTimeout after
// the first call timed out, not a whole ProbeTimeout: every call meanwhile
// may go to it, and with short leases that window decided whether the
// HTTP API's heartbeats (which cannot wait long for any one member) kept
// their registrations.
func TestHungMemberLeftOutBeforeTheProbeTimeout(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{})
	// Long, to tell a quarter of it from the whole on a busy machine.
	const probeTimeout = 20 * time.Second
	s := newStore(t, nil, etcd.Config{Endpoints: c.Endpoints(), ProbeTimeout: probeTimeout})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A follower: with the leader stopped the others answer no
	// linearizable read until they elect one, and are rightly left out
	// meanwhile too.
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hung := c.Members()[0]
	if hung == leader {
		hung = c.Members()[1]
	}
	if err := hung.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hung.Resume() }()
	var first time.Time // the first call that timed out
	changed := s.ExcludedChanged()
	for i := 0; first.IsZero(); i++ {
		if i > 100 {
			t.Fatal("no call reached the stopped member")
		}
		cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := s.Get(cctx, fmt.Sprintf("/quick/k%d", i))
		ccancel()
		if errors.Is(err, store.ErrUnavailable) {
			first = time.Now()
		} else if !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
	}
	select {
	case <-changed:
	case <-time.After(probeTimeout):
		t.Fatalf("stopped member not left out %v after the first timeout: %v", probeTimeout, s.Excluded())
	}
	took := time.Since(first)
	t.Logf("stopped member left out %v after the first call timed out (ProbeTimeout %v): %v", took.Round(time.Millisecond), probeTimeout, s.Excluded())
	if !slices.Equal(s.Excluded(), []string{hung.ClientURL}) {
		t.Fatalf("left out %v, want %v", s.Excluded(), hung.ClientURL)
	}
	// A quarter of the timeout, with as much again of slack for a loaded
	// machine: still half of the whole timeout.
	if bound := probeTimeout / 2; took > bound {
		t.Fatalf("left out after %v, bound %v", took, bound)
	}
}

// TestSlowMemberLeftOut: a follower whose disk is slow (every WAL sync
// waits) answers its status at once, but a linearizable read on it waits
// for its raft log to be applied. Such a member used to be put back at
// every probe (it answered its status with a leader), so that a share of
// every call kept waiting on it: the HTTP API's heartbeats, whose store
// calls each have a sixth of the TTL, lost their leases. Now a call that
// timed out on it has it left out, it stays out while it is slow, and it
// is put back once its disk is fast again.
func TestSlowMemberLeftOut(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartProcessCluster(t, 3, etcdtest.ProcessClusterOptions{SlowDisk: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader := etcdtest.WaitProcessLeader(t, c, time.Minute)
	var slow *etcdproc.Member
	var others []string
	for _, m := range c.Members() {
		if m != leader && slow == nil {
			slow = m
		} else {
			others = append(others, m.ClientURL)
		}
	}
	s := newStore(t, nil, etcd.Config{Endpoints: c.Endpoints(), ProbeTimeout: probe})
	// Writes (each a WAL sync on every member) keep the slow member's
	// log behind.
	writer := newStore(t, nil, etcd.Config{Endpoints: others})
	wctx, stopWrites := context.WithCancel(ctx)
	writes := make(chan error, 1)
	go func() {
		defer close(writes)
		for wctx.Err() == nil {
			if _, err := writer.Put(wctx, "/slow/load", []byte("x")); err != nil && wctx.Err() == nil {
				writes <- err
				return
			}
		}
	}()
	defer func() {
		stopWrites()
		if err := <-writes; err != nil {
			t.Errorf("writer: %v", err)
		}
	}()
	const delay = 3 * time.Second
	if err := slow.SetFsyncDelay(delay); err != nil {
		t.Fatal(err)
	}
	changed := s.ExcludedChanged()
	timeouts := 0
	for i := 0; !slices.Equal(s.Excluded(), []string{slow.ClientURL}); i++ {
		if i > 200 {
			t.Fatalf("slow member not left out: excluded %v", s.Excluded())
		}
		cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := s.Get(cctx, fmt.Sprintf("/slow/k%d", i))
		ccancel()
		if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrUnavailable) {
			t.Fatal(err)
		}
		if errors.Is(err, store.ErrUnavailable) {
			timeouts++
			select { // a sweep follows
			case <-changed:
				changed = s.ExcludedChanged()
			case <-time.After(10 * probe):
			}
		}
		if timeouts > 5 {
			t.Fatalf("%d reads timed out and the slow member is not left out: excluded %v", timeouts, s.Excluded())
		}
	}
	// Out while slow: no read waits for it, through several rechecks (one
	// per ProbeTimeout), each of which finds it slow again.
	for i := range 2 {
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		_, _ = s.Get(wctx, fmt.Sprintf("/slow/warm%d", i)) // the balancer applies the endpoints
		wcancel()
	}
	for i := range 30 {
		cctx, ccancel := context.WithTimeout(ctx, delay/3)
		_, err := s.Get(cctx, fmt.Sprintf("/slow/again%d", i))
		ccancel()
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("read %d after the slow member was left out: %v (excluded %v)", i, err, s.Excluded())
		}
	}
	if !slices.Equal(s.Excluded(), []string{slow.ClientURL}) {
		t.Fatalf("excluded %v while %s is slow", s.Excluded(), slow.Name)
	}
	// A fast disk again: put back.
	if err := slow.SetFsyncDelay(0); err != nil {
		t.Fatal(err)
	}
	for len(s.Excluded()) > 0 {
		changed := s.ExcludedChanged()
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("member with a fast disk again still left out: %v", s.Excluded())
		}
	}
}
