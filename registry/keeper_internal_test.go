package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// verdictLog records what a lease keeper tells its session.
type verdictLog struct {
	lost, unconfirmed chan error
	renewed           chan time.Duration
}

func newVerdictLog() *verdictLog {
	return &verdictLog{lost: make(chan error, 8), unconfirmed: make(chan error, 8), renewed: make(chan time.Duration, 8)}
}

// offer sends x unless ch is full (the keeper never blocks on its session).
func offer[T any](ch chan T, x T) {
	select {
	case ch <- x:
	default:
	}
}

func (v *verdictLog) markLost(_ store.LeaseID, err error, _ bool) { offer(v.lost, err) }
func (v *verdictLog) reportUnconfirmed(_ store.LeaseID, _ time.Duration, err error) {
	offer(v.unconfirmed, err)
}
func (v *verdictLog) reportRenewed(_ store.LeaseID, _ time.Time, granted time.Duration) {
	offer(v.renewed, granted)
}

// signalHandler signals ch for every record whose message is msg.
type signalHandler struct {
	msg string
	ch  chan struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// keeperOver returns a keeper of st (not running) and what it reports.
func keeperOver(t *testing.T, st store.Store) (*leaseKeeper, *verdictLog, chan struct{}, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v := newVerdictLog()
	failed := make(chan struct{}, 1)
	m, err := newMetrics(nil) // counted, not exported
	if err != nil {
		t.Fatal(err)
	}
	k := &leaseKeeper{st: st, ctx: ctx, m: m, retryMax: 10 * time.Millisecond, v: v, kick: make(chan struct{}, 1),
		log: slog.New(signalHandler{msg: "session keep-alive failed; retrying", ch: failed})}
	return k, v, failed, cancel
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case x := <-ch:
		return x
	case <-time.After(time.Minute):
		t.Fatalf("no %s within a minute", what)
		panic("unreachable")
	}
}

// A renewal that fails before a whole TTL went unanswered is retried and
// reported nothing; once past it, the lease is reported unconfirmed, never
// lost (the store did not say it ended).
func TestKeeperUnconfirmedOnlyPastTheTTL(t *testing.T) {
	st := memory.New(memory.Config{})
	_ = st.Close() // every keep-alive fails at once, without a verdict
	for _, past := range []bool{false, true} {
		k, v, failed, cancel := keeperOver(t, st)
		k.hold(7, time.Hour)
		if past {
			k.lastOK = time.Now().Add(-2 * time.Hour)
		}
		done := make(chan struct{})
		go func() { defer close(done); k.renew(7) }()
		receive(t, failed, "failed attempt")
		receive(t, failed, "second attempt")
		if past {
			if err := receive(t, v.unconfirmed, "unconfirmed report"); err == nil {
				t.Fatal("unconfirmed reported without the attempt's error")
			}
		}
		cancel()
		<-done
		select {
		case err := <-v.unconfirmed:
			if !past {
				t.Fatalf("unconfirmed reported before a TTL went unanswered: %v", err)
			}
		default:
		}
		if len(v.lost) != 0 {
			t.Fatalf("lost reported without the store saying the lease ended: %v", <-v.lost)
		}
	}
}

// The store's verdict: a lease it does not know is lost, at the first
// answer; a renewal it answers is reported with the TTL granted.
func TestKeeperVerdictsFromTheStore(t *testing.T) {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	k, v, _, _ := keeperOver(t, st)
	k.hold(12345, time.Minute) // never granted
	k.renew(12345)
	if err := receive(t, v.lost, "lost verdict"); !errors.Is(err, store.ErrLeaseNotFound) {
		t.Fatalf("lost with %v, want ErrLeaseNotFound", err)
	}
	l, err := st.Grant(context.Background(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k.hold(l.ID, time.Minute)
	k.renew(l.ID)
	if got := receive(t, v.renewed, "renewal"); got != l.TTL {
		t.Fatalf("renewed with %v, want the store's %v", got, l.TTL)
	}
	if len(v.lost) != 0 || len(v.unconfirmed) != 0 {
		t.Fatal("a successful renewal reported a loss")
	}
}

// listHook is a memory store that runs a function once, at the next List.
type listHook struct {
	*memory.Store
	hook atomic.Pointer[func()]
}

func (h *listHook) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	if f := h.hook.Swap(nil); f != nil {
		(*f)()
	}
	return h.Store.List(ctx, prefix)
}

// The lease a recovery took lapses while it writes the registrations: the
// recovery starts over with another lease rather than declaring itself
// recovered on a lease nobody renews.
func TestSessionRecoveryStartsOverWhenItsLeaseLapses(t *testing.T) {
	st := &listHook{Store: memory.New(memory.Config{})}
	t.Cleanup(func() { _ = st.Close() })
	r, err := New(st, Config{LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	g := &sessionRig{st: st.Store, r: r, ns: "lapse"}
	reg := g.register(t, "10.0.0.1:80")
	l1 := g.next(t, StateActive).Lease
	var l2 atomic.Int64
	lapse := func() {
		l, _ := r.sess.k.current()
		l2.Store(int64(l))
		r.sess.markLost(l, store.ErrLeaseNotFound, false)
	}
	st.hook.Store(&lapse)
	r.sess.markLost(l1, store.ErrPermissionDenied, false)
	c := g.next(t, StateRecovered)
	if lapsed := store.LeaseID(l2.Load()); lapsed == store.NoLease || c.Lease == lapsed || c.Lease == l1 {
		t.Fatalf("recovered on %x; the first lease was %x, the one that lapsed %x: want a third", c.Lease, l1, lapsed)
	}
	if !r.sess.k.holds(c.Lease) || g.boundTo(t, reg) != c.Lease {
		t.Fatalf("recovered on %x: held %v, key bound to %x", c.Lease, r.sess.k.holds(c.Lease), g.boundTo(t, reg))
	}
}

// A conflict is retried on the worker's own schedule (every keep-alive
// interval), not only at the periodic check of every key: once the other
// process's lease ends, the session reclaims the ID.
func TestSessionReclaimsAConflictOnceFreed(t *testing.T) {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	r, err := New(st, Config{LeaseTTL: 3 * time.Second, VerifyInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	g := &sessionRig{st: st, r: r, ns: "reclaim"}
	reg := g.register(t, "10.0.0.1:80")
	l1 := g.next(t, StateActive).Lease
	foreign, err := st.Grant(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Revoke(context.Background(), l1); err != nil {
		t.Fatal(err)
	}
	key := r.ks.Key(reg.Instance().Ref())
	if _, err := st.Create(context.Background(), key, []byte(`{"someone":"else"}`), store.WithLease(foreign.ID)); err != nil {
		t.Fatal(err)
	}
	r.sess.markLost(l1, store.ErrLeaseNotFound, false)
	if c := g.next(t, StateRecovered); len(c.Conflicts) != 1 {
		t.Fatalf("recovered with conflicts %v, want one", c.Conflicts)
	}
	if err := st.Revoke(context.Background(), foreign.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(time.Minute)
	for {
		select {
		case c := <-r.States():
			if len(c.Conflicts) == 0 && c.Registered == 1 {
				if got := g.boundTo(t, reg); got != c.Lease || got == store.NoLease {
					t.Fatalf("reclaimed: key bound to %x, want %x", got, c.Lease)
				}
				return
			}
		case <-deadline:
			t.Fatalf("the ID was not reclaimed within a minute of the other lease ending (Err %v)", reg.Err())
		}
	}
}

// A registration whose write is behind the lease (an update of unknown
// outcome, an admission during a recovery) says so in Err, and the worker,
// woken, writes it at once rather than at its next interval (here 20
// minutes away).
func TestSessionWritesStaleRegistrationsWhenWoken(t *testing.T) {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	r, err := New(st, Config{LeaseTTL: time.Hour, VerifyInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	g := &sessionRig{st: st, r: r, ns: "stale"}
	reg := g.register(t, "10.0.0.1:80")
	lease := g.next(t, StateActive).Lease
	key := r.ks.Key(reg.Instance().Ref())
	if _, err := st.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, rev, err := st.List(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	events := st.Watch(ctx, key, rev+1)
	r.sess.rc.invalidate(reg.(*registration))
	if err := reg.Err(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Err of a registration behind the lease = %v, want ErrLeaseLost", err)
	}
	r.sess.kickLoop()
	for resp := range events {
		if resp.Err != nil {
			t.Fatalf("the worker did not write the stale registration: %v", resp.Err)
		}
		for _, e := range resp.Events {
			if e.Type == store.EventPut && e.KV.Lease == lease {
				return // written again under the lease
			}
		}
	}
	t.Fatal("watch ended")
}

// refusingKeepAlives is a store that refuses every keep-alive, as etcd
// does once the process's credentials or role were withdrawn.
type refusingKeepAlives struct{ store.Store }

func (refusingKeepAlives) KeepAlive(context.Context, store.LeaseID) (time.Duration, error) {
	return 0, fmt.Errorf("keep-alive: %w", store.ErrPermissionDenied)
}

// A refused keep-alive is a verdict, at the first answer: retrying the same
// credentials cannot succeed, so the lease is reported lost at once (with
// the refusal), not retried until a TTL went unanswered.
func TestKeeperRefusedCredentialsAreLost(t *testing.T) {
	mem := memory.New(memory.Config{})
	t.Cleanup(func() { _ = mem.Close() })
	k, v, failed, cancel := keeperOver(t, refusingKeepAlives{mem})
	k.hold(7, time.Hour)
	done := make(chan struct{})
	go func() { defer close(done); k.renew(7) }()
	select {
	case err := <-v.lost:
		if !errors.Is(err, store.ErrPermissionDenied) {
			t.Fatalf("lost with %v, want ErrPermissionDenied", err)
		}
	case <-failed:
		t.Fatal("a refused keep-alive was retried")
	case <-time.After(time.Minute):
		t.Fatal("no verdict within a minute")
	}
	cancel()
	<-done
}
