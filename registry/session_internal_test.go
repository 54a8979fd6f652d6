package registry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// The session's transitions and the lease keeper's invariants, one test
// each (the state machine is drawn in doc.go). The oracle is the store:
// which lease a key is bound to, read with Get, and the states reported
// on States.

type sessionRig struct {
	st *memory.Store
	r  *StoreRegistry
	ns string
}

func newSessionRig(t *testing.T) *sessionRig {
	t.Helper()
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	r, err := New(st, Config{LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return &sessionRig{st: st, r: r, ns: fmt.Sprintf("si-%d", time.Now().UnixNano())}
}

func (g *sessionRig) register(t *testing.T, addr string) Registration {
	t.Helper()
	in := beacon.Instance{Namespace: g.ns, Component: "api", Endpoint: "http", Address: addr, Transport: "http"}
	reg, err := g.r.Register(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// boundTo returns the lease the store binds reg's key to.
func (g *sessionRig) boundTo(t *testing.T, reg Registration) store.LeaseID {
	t.Helper()
	kv, err := g.st.Get(context.Background(), g.r.ks.Key(reg.Instance().Ref()))
	if err != nil {
		t.Fatalf("%s: %v", reg.Instance().Ref(), err)
	}
	return kv.Lease
}

// next returns the next state change reported, waiting at most a minute.
func (g *sessionRig) next(t *testing.T, want State) StateChange {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case c := <-g.r.States():
			if c.State == want {
				return c
			}
		case <-deadline:
			t.Fatalf("no %v within a minute (now %v)", want, g.r.State())
		}
	}
}

// Idle until the first Register, which grants the lease: active, and the
// key is bound to the lease the registry reports.
func TestSessionIdleToActiveOnFirstRegister(t *testing.T) {
	g := newSessionRig(t)
	if s, l := g.r.State(), g.r.Lease(); s != StateIdle || l != store.NoLease {
		t.Fatalf("before Register: %v lease %x, want idle without a lease", s, l)
	}
	reg := g.register(t, "10.0.0.1:80")
	c := g.next(t, StateActive)
	if c.Lease == store.NoLease || g.boundTo(t, reg) != c.Lease || g.r.Lease() != c.Lease {
		t.Fatalf("active on %x, registry says %x, key bound to %x", c.Lease, g.r.Lease(), g.boundTo(t, reg))
	}
}

// The ring of previous leases: a lease given up while the store still
// holds it (a refused renewal: etcd keeps it until its TTL runs out)
// leaves the session's keys bound to it. Re-registering takes them over
// under the new lease; they are the session's own, not another process's
// (forgetting the ring reports every instance in conflict, "held by
// another live process", until the old lease expires). The leased API
// keeps refusing the previous lease as the session's.
func TestSessionTakesOverKeysOfPreviousLeases(t *testing.T) {
	g := newSessionRig(t)
	regs := []Registration{g.register(t, "10.0.0.1:80"), g.register(t, "10.0.0.2:80")}
	l1 := g.next(t, StateActive).Lease
	g.r.sess.markLost(l1, fmt.Errorf("keep-alive: %w", store.ErrPermissionDenied), false)
	g.next(t, StateLost)
	c := g.next(t, StateRecovered)
	if c.Lease == l1 || c.Lease == store.NoLease {
		t.Fatalf("recovered on %x, want a new lease (the old one was %x)", c.Lease, l1)
	}
	if len(c.Conflicts) != 0 || c.Registered != 2 || c.Err != nil {
		t.Fatalf("recovered with conflicts %v, %d registered, err %v: want the keys of %x taken over", c.Conflicts, c.Registered, c.Err, l1)
	}
	for _, reg := range regs {
		if got := g.boundTo(t, reg); got != c.Lease {
			t.Fatalf("%s bound to %x, want the new lease %x", reg.Instance().Ref(), got, c.Lease)
		}
		if err := reg.Err(); err != nil {
			t.Fatalf("%s: Err = %v", reg.Instance().Ref(), err)
		}
	}
	if _, err := g.st.KeepAlive(context.Background(), l1); err != nil {
		t.Fatalf("the previous lease should still be alive in the store for this test to mean anything: %v", err)
	}
	if err := g.r.checkLease(l1); !errors.Is(err, ErrLeaseMismatch) {
		t.Fatalf("checkLease(previous session lease) = %v, want ErrLeaseMismatch", err)
	}
}

// A key bound to a live lease that was never the session's is another
// process's: re-registering reports it in conflict and leaves it alone.
func TestSessionRespectsKeysOfForeignLeases(t *testing.T) {
	g := newSessionRig(t)
	reg := g.register(t, "10.0.0.1:80")
	l1 := g.next(t, StateActive).Lease
	foreign, err := g.st.Grant(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	key := g.r.ks.Key(reg.Instance().Ref())
	if err := g.st.Revoke(context.Background(), l1); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.Create(context.Background(), key, []byte(`{"someone":"else"}`), store.WithLease(foreign.ID)); err != nil {
		t.Fatal(err)
	}
	g.r.sess.markLost(l1, store.ErrLeaseNotFound, false)
	c := g.next(t, StateRecovered)
	if len(c.Conflicts) != 1 || c.Conflicts[0] != reg.Instance().Ref() || !errors.Is(c.Err, beacon.ErrAlreadyRegistered) {
		t.Fatalf("recovered with conflicts %v err %v, want %s in conflict", c.Conflicts, c.Err, reg.Instance().Ref())
	}
	if got := g.boundTo(t, reg); got != foreign.ID {
		t.Fatalf("key bound to %x, want the other process's %x untouched", got, foreign.ID)
	}
	if err := reg.Err(); !errors.Is(err, beacon.ErrAlreadyRegistered) {
		t.Fatalf("Err = %v, want ErrAlreadyRegistered", err)
	}
}

// A loss verdict about a lease the session no longer holds (a late
// keep-alive answer, a write that failed under the previous lease) changes
// nothing.
func TestSessionIgnoresVerdictsOnPreviousLeases(t *testing.T) {
	g := newSessionRig(t)
	reg := g.register(t, "10.0.0.1:80")
	l1 := g.next(t, StateActive).Lease
	g.r.sess.markLost(l1, store.ErrPermissionDenied, false)
	l2 := g.next(t, StateRecovered).Lease
	g.r.sess.markLost(l1, store.ErrLeaseNotFound, false)
	g.r.sess.reportUnconfirmed(l1, time.Minute, errors.New("late"))
	g.r.sess.reportRenewed(l1, time.Now().Add(-time.Hour), time.Second)
	if s, l := g.r.State(), g.r.Lease(); s != StateRecovered || l != l2 || !g.r.sess.k.holds(l2) {
		t.Fatalf("after verdicts on %x: %v on %x (held %v), want recovered on %x", l1, s, l, g.r.sess.k.holds(l2), l2)
	}
	if _, ttl := g.r.sess.k.current(); ttl != time.Minute {
		t.Fatalf("a late renewal of the previous lease set the TTL to %v", ttl)
	}
	select {
	case c := <-g.r.States():
		t.Fatalf("a verdict on a previous lease reported %v", c)
	default:
	}
	if got := g.boundTo(t, reg); got != l2 {
		t.Fatalf("key bound to %x, want %x", got, l2)
	}
}

// A lost lease the store still holds (suspect) is tried first: recovery
// keeps it, and writes nothing new.
func TestSessionRecoveryKeepsASuspectLeaseAlive(t *testing.T) {
	g := newSessionRig(t)
	reg := g.register(t, "10.0.0.1:80")
	l1 := g.next(t, StateActive).Lease
	g.r.sess.markLost(l1, errors.New("unknown outcome"), true)
	g.next(t, StateLost)
	c := g.next(t, StateRecovered)
	if c.Lease != l1 || g.boundTo(t, reg) != l1 {
		t.Fatalf("recovered on %x, key on %x: want the suspect lease %x kept", c.Lease, g.boundTo(t, reg), l1)
	}
}

// A suspect lease the store says ended is replaced by a new one, and every
// registration written again under it.
func TestSessionRecoveryReplacesAnEndedSuspectLease(t *testing.T) {
	g := newSessionRig(t)
	reg := g.register(t, "10.0.0.1:80")
	l1 := g.next(t, StateActive).Lease
	if err := g.st.Revoke(context.Background(), l1); err != nil {
		t.Fatal(err)
	}
	g.r.sess.markLost(l1, errors.New("unknown outcome"), true)
	c := g.next(t, StateRecovered)
	if c.Lease == l1 || g.boundTo(t, reg) != c.Lease || c.Registered != 1 {
		t.Fatalf("recovered on %x (%d registered), key on %x: want a new lease", c.Lease, c.Registered, g.boundTo(t, reg))
	}
}

// The ring keeps the last oldLeasesKept leases, each once, and never
// NoLease.
func TestLeaseRingKeepsTheLastLeases(t *testing.T) {
	g := newSessionRig(t)
	k := g.r.sess.k
	if k.ours(store.NoLease) {
		t.Fatal("NoLease counted as ours before any lease was held")
	}
	const n = oldLeasesKept + 3
	for i := 1; i <= n; i++ {
		k.hold(store.LeaseID(i), time.Minute)
	}
	k.hold(store.LeaseID(n-1), time.Minute) // back to a previous one
	k.hold(store.LeaseID(n), time.Minute)
	for i := 1; i <= n; i++ {
		want := i > n-oldLeasesKept
		if got := k.ours(store.LeaseID(i)); got != want {
			t.Fatalf("ours(%d) = %v, want %v (ring %v, lease %x)", i, got, want, k.old, k.lease)
		}
	}
	if k.ours(store.NoLease) || k.ours(store.LeaseID(n+1)) {
		t.Fatal("NoLease or a lease never held counted as ours")
	}
	seen := map[store.LeaseID]bool{}
	for _, l := range k.old {
		if seen[l] {
			t.Fatalf("ring holds %x twice: %v", l, k.old)
		}
		seen[l] = true
	}
}

// Renewals of a lease other than the one held, or of one dropped, change
// nothing; a renewal of the held one moves its deadline and TTL.
func TestLeaseKeeperRenewalsOnlyOfTheHeldLease(t *testing.T) {
	g := newSessionRig(t)
	k := g.r.sess.k
	k.hold(1, time.Minute)
	k.hold(2, time.Minute)
	if held, _ := k.renewed(1, time.Now(), time.Hour); held {
		t.Fatal("a renewal of the previous lease counted")
	}
	at := time.Now().Add(time.Second)
	if held, _ := k.renewed(2, at, 2*time.Minute); !held {
		t.Fatal("a renewal of the held lease did not count")
	}
	if l, ttl := k.current(); l != 2 || ttl != 2*time.Minute || !k.lastOK.Equal(at) {
		t.Fatalf("after renewal: lease %x ttl %v lastOK %v, want 2, 2m, %v", l, ttl, k.lastOK, at)
	}
	if !k.drop(2) || k.drop(2) || k.holds(2) {
		t.Fatal("drop: want true once, then false, and the lease no longer held")
	}
	if held, _ := k.renewed(2, time.Now(), time.Hour); held {
		t.Fatal("a renewal of a dropped lease counted")
	}
}

// Unconfirmed is reported once per episode; a renewal ends the episode
// (reporting a confirmation), and so does dropping the lease.
func TestLeaseKeeperUnconfirmedOncePerEpisode(t *testing.T) {
	g := newSessionRig(t)
	k := g.r.sess.k
	k.hold(1, time.Minute)
	if !k.markUnconfirmed(1) || k.markUnconfirmed(1) {
		t.Fatal("markUnconfirmed: want true once, then false")
	}
	if k.markUnconfirmed(2) {
		t.Fatal("markUnconfirmed of a lease not held")
	}
	if held, was := k.renewed(1, time.Now(), time.Minute); !held || !was {
		t.Fatalf("renewed = %v, %v: want held and a confirmation", held, was)
	}
	if held, was := k.renewed(1, time.Now(), time.Minute); !held || was {
		t.Fatalf("renewed again = %v, %v: want held, no confirmation", held, was)
	}
	if !k.markUnconfirmed(1) {
		t.Fatal("a new episode was not reported")
	}
	k.drop(1)
	if k.unconfirmed {
		t.Fatal("a dropped lease stays unconfirmed")
	}
	k.hold(3, time.Minute)
	if !k.markUnconfirmed(3) {
		t.Fatal("unconfirmed not reported for a new lease")
	}
	k.hold(4, time.Minute)
	if k.unconfirmed {
		t.Fatal("a new lease starts unconfirmed")
	}
}

// The keep-alive retry pause: at once after an attempt that used its time,
// at most a quarter of what is left before the deadline otherwise, backoff
// once past it.
func TestKeeperRetryDelay(t *testing.T) {
	bo := newBackoff(time.Second)
	if d := retryDelay(bo, 75*time.Millisecond, 100*time.Millisecond, time.Now().Add(time.Minute)); d != 0 {
		t.Fatalf("after a timed-out attempt: %v, want 0", d)
	}
	if d := retryDelay(newBackoff(time.Hour), time.Millisecond, 100*time.Millisecond, time.Now().Add(400*time.Millisecond)); d > 100*time.Millisecond {
		t.Fatalf("before the deadline: %v, want at most a quarter of what is left", d)
	}
	if d := retryDelay(newBackoff(time.Second), time.Millisecond, 100*time.Millisecond, time.Now().Add(-time.Second)); d <= 0 {
		t.Fatalf("past the deadline: %v, want a backoff", d)
	}
}
