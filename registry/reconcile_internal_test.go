package registry

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// reconcilerRig is a reconciler of a registry over the memory store (never
// started: these tests drive the reconciler's bookkeeping alone) and the
// Prometheus registry its metrics go to.
func reconcilerRig(t *testing.T) (*reconciler, *prometheus.Registry) {
	t.Helper()
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	metrics := prometheus.NewRegistry()
	r, err := New(st, Config{LeaseTTL: time.Hour, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r.sess.rc, metrics
}

func trackedReg(rc *reconciler, id string) *registration {
	ref := beacon.Ref{Namespace: "ns", Component: "c", Endpoint: "e", ID: id}
	return &registration{r: rc.r, s: rc.r.sess, rc: rc, key: rc.r.ks.Key(ref), ref: ref}
}

// gauge reads a gauge or a counter.
func gauge(t *testing.T, metrics *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// A key is reserved by one registration at a time; a reservation not
// admitted is given up by unreserve, an admitted one is not; claimed
// names the holder.
func TestReconcilerReservesEachKeyOnce(t *testing.T) {
	rc, _ := reconcilerRig(t)
	a, b := trackedReg(rc, "00000000000000a1"), trackedReg(rc, "00000000000000a1")
	if err := rc.reserve(a); err != nil {
		t.Fatal(err)
	}
	if err := rc.reserve(b); !errors.Is(err, beacon.ErrAlreadyRegistered) {
		t.Fatalf("second reservation of a key: %v, want ErrAlreadyRegistered", err)
	}
	if !rc.claimed(a.key, b) || rc.claimed(a.key, a) || rc.claimed("/other", nil) {
		t.Fatal("claimed: want true for another registration, false for the holder and for an unknown key")
	}
	rc.unreserve(b) // not the holder: nothing happens
	if !rc.claimed(a.key, nil) {
		t.Fatal("unreserve of another registration gave up the holder's key")
	}
	if !rc.admit(a, 3) {
		t.Fatal("admit of the holder refused")
	}
	rc.unreserve(a)
	if !rc.claimed(a.key, nil) {
		t.Fatal("unreserve gave up an admitted registration's key")
	}
	rc.remove(a)
	if err := rc.reserve(b); err != nil {
		t.Fatalf("reserve after the holder was removed: %v", err)
	}
	rc.unreserve(b)
	if rc.claimed(b.key, nil) {
		t.Fatal("unreserve kept a reservation never admitted")
	}
}

// A registration's held flag says exactly whether the reconciler's map
// holds it at its key, after every operation that changes the map
// (reserve, unreserve, remove, close), for the holder and for another
// registration of the same key alike: the registration's own paths read
// the flag instead of the map.
func TestReconcilerHeldMirrorsTheMap(t *testing.T) {
	rc, _ := reconcilerRig(t)
	a, twin, b := trackedReg(rc, "00000000000000d1"), trackedReg(rc, "00000000000000d1"), trackedReg(rc, "00000000000000d2")
	agree := func(step string) {
		t.Helper()
		rc.mu.Lock()
		defer rc.mu.Unlock()
		for _, reg := range []*registration{a, twin, b} {
			if inMap := rc.regs[reg.key] == reg; reg.held != inMap {
				t.Fatalf("after %s: %s held = %v, map holds it = %v", step, reg.ref.ID, reg.held, inMap)
			}
		}
	}
	agree("nothing")
	_ = rc.reserve(a)
	_ = rc.reserve(twin) // refused: the key is a's
	_ = rc.reserve(b)
	agree("reserve")
	rc.unreserve(twin)
	rc.unreserve(b)
	agree("unreserve")
	rc.admit(a, 1)
	rc.unreserve(a) // admitted: kept
	agree("unreserve of an admitted registration")
	rc.remove(twin)
	agree("remove of a registration not held")
	rc.remove(a)
	agree("remove")
	_ = rc.reserve(twin)
	_ = rc.reserve(b)
	rc.admit(b, 1)
	agree("reserve again")
	rc.close()
	agree("close")
	if rc.admit(twin, 2) || rc.outcome(b) != (writeOutcome{}) {
		t.Fatal("a closed reconciler admitted a registration or kept a standing")
	}
}

// A registration's standing is what admit, setWritten and invalidate
// recorded, only for the registration that holds the key; remove returns
// the last standing and stops tracking it.
func TestReconcilerRecordsStanding(t *testing.T) {
	rc, metrics := reconcilerRig(t)
	a, stranger := trackedReg(rc, "00000000000000b1"), trackedReg(rc, "00000000000000b1")
	if err := rc.reserve(a); err != nil {
		t.Fatal(err)
	}
	if got := rc.outcome(a); got != (writeOutcome{}) {
		t.Fatalf("standing of a reservation = %+v, want zero", got)
	}
	if rc.admit(stranger, 1) {
		t.Fatal("admit of a registration that does not hold the key succeeded")
	}
	rc.admit(a, 4)
	if got := rc.outcome(a); got != (writeOutcome{admitted: true, epoch: 4}) {
		t.Fatalf("after admit = %+v, want admitted in epoch 4", got)
	}
	if n := gauge(t, metrics, metricRegistrations); n != 1 {
		t.Fatalf("registrations gauge after admit = %v, want 1", n)
	}
	conflict := errors.New("held elsewhere")
	rc.setWritten(a, 5, conflict)
	rc.setWritten(stranger, 9, nil) // not tracked: ignored
	rc.invalidate(stranger)
	if got := rc.outcome(a); !got.admitted || got.epoch != 5 || !errors.Is(got.err, conflict) {
		t.Fatalf("after setWritten = %+v, want admitted, epoch 5, the conflict", got)
	}
	if got := rc.outcome(stranger); got != (writeOutcome{}) {
		t.Fatalf("standing of an untracked registration = %+v, want zero", got)
	}
	rc.invalidate(a)
	if got := rc.outcome(a); got.epoch != 0 || !got.admitted {
		t.Fatalf("after invalidate = %+v, want admitted in epoch 0", got)
	}
	if got := rc.remove(a); !got.admitted || !errors.Is(got.err, conflict) {
		t.Fatalf("remove returned %+v, want the last standing", got)
	}
	if got := rc.remove(a); got != (writeOutcome{}) {
		t.Fatalf("second remove returned %+v, want zero", got)
	}
	if n := gauge(t, metrics, metricRegistrations); n != 0 {
		t.Fatalf("registrations gauge after remove = %v, want 0", n)
	}
}

// pending selects by mode: staleOnly those behind the epoch,
// staleAndConflicts also those in conflict, verifyAll every admitted one;
// never a reservation not admitted; sorted by key. stale agrees.
func TestReconcilerPendingByMode(t *testing.T) {
	rc, _ := reconcilerRig(t)
	current, behind, conflicted, reserved :=
		trackedReg(rc, "00000000000000c1"), trackedReg(rc, "00000000000000c2"),
		trackedReg(rc, "00000000000000c3"), trackedReg(rc, "00000000000000c4")
	for _, reg := range []*registration{reserved, conflicted, behind, current} {
		if err := rc.reserve(reg); err != nil {
			t.Fatal(err)
		}
	}
	rc.admit(current, 7)
	rc.admit(behind, 6)
	rc.admit(conflicted, 7)
	rc.setWritten(conflicted, 7, beacon.ErrAlreadyRegistered)
	keys := func(regs []*registration) []string {
		var out []string
		for _, reg := range regs {
			out = append(out, reg.ref.ID)
		}
		return out
	}
	for _, tc := range []struct {
		mode reconcileMode
		want []string
	}{
		{staleOnly, []string{"00000000000000c2"}},
		{staleAndConflicts, []string{"00000000000000c2", "00000000000000c3"}},
		{verifyAll, []string{"00000000000000c1", "00000000000000c2", "00000000000000c3"}},
	} {
		if got := keys(rc.pending(7, tc.mode)); !slices.Equal(got, tc.want) {
			t.Errorf("pending(7, %d) = %v, want %v", tc.mode, got, tc.want)
		}
	}
	if !rc.stale(7) {
		t.Error("stale(7) = false with a registration written in 6")
	}
	rc.setWritten(behind, 7, nil)
	if rc.stale(7) {
		t.Error("stale(7) = true with every admitted registration written in 7")
	}
}

// report lists the admitted conflicts (sorted), counts the registrations
// advertised, and keeps the conflicts gauge and the reported count in
// step; conflicts says now and as last reported; close forgets every
// registration, zeroes both gauges and refuses new ones.
func TestReconcilerReportsAndCloses(t *testing.T) {
	rc, metrics := reconcilerRig(t)
	ok, x, y, reserved := trackedReg(rc, "00000000000000d1"), trackedReg(rc, "00000000000000d3"),
		trackedReg(rc, "00000000000000d2"), trackedReg(rc, "00000000000000d4")
	for _, reg := range []*registration{ok, x, y, reserved} {
		if err := rc.reserve(reg); err != nil {
			t.Fatal(err)
		}
	}
	for _, reg := range []*registration{ok, x, y} {
		rc.admit(reg, 1)
	}
	rc.setWritten(x, 1, beacon.ErrAlreadyRegistered)
	rc.setWritten(y, 1, beacon.ErrAlreadyRegistered)
	rc.setWritten(ok, 1, errors.New("not a conflict")) // neither advertised nor a conflict
	if now, reported := rc.conflicts(); now != 2 || reported != 0 {
		t.Fatalf("conflicts before a report = %d, %d; want 2, 0", now, reported)
	}
	conflicts, registered := rc.report()
	if len(conflicts) != 2 || conflicts[0].ID != "00000000000000d2" || conflicts[1].ID != "00000000000000d3" || registered != 0 {
		t.Fatalf("report = %v, %d; want d2, d3 and 0 registered", conflicts, registered)
	}
	if now, reported := rc.conflicts(); now != 2 || reported != 2 {
		t.Fatalf("conflicts after a report = %d, %d; want 2, 2", now, reported)
	}
	if n := gauge(t, metrics, metricConflicts); n != 2 {
		t.Fatalf("conflicts gauge = %v, want 2", n)
	}
	rc.setWritten(x, 1, nil)
	rc.setWritten(ok, 1, nil)
	if conflicts, registered = rc.report(); len(conflicts) != 1 || registered != 2 {
		t.Fatalf("report = %v, %d; want d2 alone and 2 registered", conflicts, registered)
	}
	if n := gauge(t, metrics, metricConflicts); n != 1 {
		t.Fatalf("conflicts gauge = %v, want 1", n)
	}
	rc.close()
	if n := gauge(t, metrics, metricConflicts); n != 0 {
		t.Fatalf("conflicts gauge after close = %v, want 0", n)
	}
	if n := gauge(t, metrics, metricRegistrations); n != 0 {
		t.Fatalf("registrations gauge after close = %v, want 0", n)
	}
	if rc.claimed(ok.key, nil) || rc.outcome(ok) != (writeOutcome{}) {
		t.Fatal("close kept a registration")
	}
	if err := rc.reserve(trackedReg(rc, "00000000000000d5")); !errors.Is(err, ErrClosed) {
		t.Fatalf("reserve after close: %v, want ErrClosed", err)
	}
}

// hookedStore is a memory store that runs a function once, at the next Get
// of a key or the next transaction (then, before it reaches the store).
type hookedStore struct {
	*memory.Store
	onGet atomic.Pointer[func() (store.KeyValue, error, bool)] // answer instead of the store when the bool is true
	onTxn atomic.Pointer[func()]
}

func (h *hookedStore) Get(ctx context.Context, key string) (store.KeyValue, error) {
	if f := h.onGet.Swap(nil); f != nil {
		if kv, err, ok := (*f)(); ok {
			return kv, err
		}
	}
	return h.Store.Get(ctx, key)
}

func (h *hookedStore) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	if f := h.onTxn.Swap(nil); f != nil {
		(*f)()
	}
	return h.Store.Txn(ctx, ops...)
}

// passRig is a registry over a hooked memory store whose worker never
// runs a pass on its own (an hour's TTL, no periodic check): the test runs
// the reconciler's passes itself.
type passRig struct {
	t       *testing.T
	st      *hookedStore
	r       *StoreRegistry
	metrics *prometheus.Registry
}

func newPassRig(t *testing.T) *passRig {
	t.Helper()
	st := &hookedStore{Store: memory.New(memory.Config{})}
	t.Cleanup(func() { _ = st.Close() })
	metrics := prometheus.NewRegistry()
	r, err := New(st, Config{LeaseTTL: time.Hour, VerifyInterval: -1, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return &passRig{t: t, st: st, r: r, metrics: metrics}
}

func (g *passRig) register(id uint64, addr string) *registration {
	g.t.Helper()
	reg, err := g.r.Register(context.Background(), beacon.Instance{Namespace: "pass", Component: "c", Endpoint: "e",
		ID: beacon.FormatID(id), Address: addr})
	if err != nil {
		g.t.Fatal(err)
	}
	return reg.(*registration)
}

// value is a stored value of reg's instance with address addr and status.
func (g *passRig) value(reg *registration, addr string, status beacon.Status) []byte {
	g.t.Helper()
	in := reg.Instance()
	in.Address, in.Status = addr, status
	val, err := encode(in, time.Hour)
	if err != nil {
		g.t.Fatal(err)
	}
	return val
}

// stored returns the address and status reg's key holds.
func (g *passRig) stored(reg *registration) (string, beacon.Status) {
	g.t.Helper()
	kv, err := g.st.Store.Get(context.Background(), reg.key)
	if err != nil {
		g.t.Fatal(err)
	}
	in, err := g.r.decode(kv)
	if err != nil {
		g.t.Fatal(err)
	}
	return in.Address, in.Status
}

func (g *passRig) pass(mode reconcileMode) (int, error) {
	lease, epoch, err := g.r.sess.acquire(context.Background())
	if err != nil {
		g.t.Fatal(err)
	}
	return g.r.sess.rc.reconcile(context.Background(), lease, epoch, mode)
}

// A key under the session's own lease that holds another value than the
// registration advertises (written by someone using the lease) is written
// back, not taken as written.
func TestReconcilerRestoresItsValueUnderItsLease(t *testing.T) {
	g := newPassRig(t)
	reg := g.register(1, "10.0.0.1:80")
	if _, err := g.st.Store.Put(context.Background(), reg.key, g.value(reg, "10.9.9.9:80", beacon.StatusServing),
		store.WithLease(g.r.Lease())); err != nil {
		t.Fatal(err)
	}
	if n, err := g.pass(verifyAll); err != nil || n != 1 {
		t.Fatalf("pass wrote %d keys (%v), want 1", n, err)
	}
	if addr, _ := g.stored(reg); addr != "10.0.0.1:80" {
		t.Fatalf("store holds %s, want the registration's 10.0.0.1:80", addr)
	}
}

// A drain made in the store is adopted only from a registration that
// advertises its instance serving: the owner's own drain is no drain
// made elsewhere (nothing reported, nothing counted); its value is
// written back.
func TestReconcilerAdoptsADrainOnlyOfAServingInstance(t *testing.T) {
	g := newPassRig(t)
	reg := g.register(1, "10.0.0.1:80")
	if err := reg.Update(context.Background(), func(in *beacon.Instance) { in.Status = beacon.StatusDraining }); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.Store.Put(context.Background(), reg.key, g.value(reg, "10.9.9.9:80", beacon.StatusDraining),
		store.WithLease(g.r.Lease())); err != nil {
		t.Fatal(err)
	}
	if _, err := g.pass(verifyAll); err != nil {
		t.Fatal(err)
	}
	if n := gauge(t, g.metrics, metricDrainedElsewhere); n != 0 {
		t.Fatalf("drained elsewhere counted %v times for the owner's own drain", n)
	}
	if addr, status := g.stored(reg); addr != "10.0.0.1:80" || status != beacon.StatusDraining {
		t.Fatalf("store holds %s %s, want the registration's 10.0.0.1:80 draining", addr, status)
	}
}

// A create that lost a race (the key appeared after the read found none)
// reads the key again and settles by what it holds: here another
// process's live key, a conflict, not an error.
func TestReconcilerWriteRereadsAfterLosingACreate(t *testing.T) {
	g := newPassRig(t)
	reg := g.register(1, "10.0.0.1:80")
	ctx := context.Background()
	if _, err := g.st.Store.Delete(ctx, reg.key); err != nil {
		t.Fatal(err)
	}
	foreign, err := g.st.Store.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.Store.Create(ctx, reg.key, []byte(`{"someone":"else"}`), store.WithLease(foreign.ID)); err != nil {
		t.Fatal(err)
	}
	absent := func() (store.KeyValue, error, bool) { return store.KeyValue{}, store.ErrNotFound, true }
	g.st.onGet.Store(&absent)
	lease, epoch, err := g.r.sess.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg.wmu.Lock()
	wrote, conflict, err := g.r.sess.rc.writeOne(ctx, reg, reg.value(), lease, epoch, drainAdopt)
	reg.wmu.Unlock()
	if wrote || err != nil || !errors.Is(conflict, beacon.ErrAlreadyRegistered) {
		t.Fatalf("writeOne = %v, conflict %v, err %v; want no write, a conflict, no error", wrote, conflict, err)
	}
}

// A transaction that fails on a key changed since the listing (here the
// first of the chunk) settles that key alone and sends the rest again.
func TestReconcilerSettlesTheChangedKeyAlone(t *testing.T) {
	g := newPassRig(t)
	a, b := g.register(1, "10.0.0.1:80"), g.register(2, "10.0.0.2:80")
	ctx := context.Background()
	for _, reg := range []*registration{a, b} {
		if _, err := g.st.Store.Delete(ctx, reg.key); err != nil {
			t.Fatal(err)
		}
	}
	lease := g.r.Lease()
	recreate := func() {
		if _, err := g.st.Store.Create(ctx, a.key, a.value(), store.WithLease(lease)); err != nil {
			t.Error(err)
		}
	}
	g.st.onTxn.Store(&recreate)
	if _, err := g.pass(verifyAll); err != nil {
		t.Fatalf("pass with the first key changed under it: %v", err)
	}
	for _, reg := range []*registration{a, b} {
		if addr, _ := g.stored(reg); addr != reg.Instance().Address {
			t.Fatalf("%s holds %s, want %s", reg.ref, addr, reg.Instance().Address)
		}
	}
}

// A registration closed while a pass had it in hand is not written again
// (Close deleted its key: the pass must not bring it back).
func TestReconcilerSkipsAClosedRegistration(t *testing.T) {
	g := newPassRig(t)
	reg := g.register(1, "10.0.0.1:80")
	lease, epoch, err := g.r.sess.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.r.sess.rc.writeChunk(context.Background(), []*registration{reg}, map[string]store.KeyValue{}, lease, epoch); err != nil {
		t.Fatal(err)
	}
	if kv, err := g.st.Store.Get(context.Background(), reg.key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("closed registration's key after a pass: %s (%v), want none", kv.Value, err)
	}
}

// A key that vanished from the store although it was written under the
// current lease is reported (someone deleted it), and written again.
func TestReconcilerReportsAVanishedKey(t *testing.T) {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	vanished := make(chan struct{}, 1)
	r, err := New(st, Config{LeaseTTL: time.Hour, VerifyInterval: -1, Logger: slog.New(signalHandler{
		msg: "registered instance vanished from the store (deleted by someone else?); registering it again", ch: vanished})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	g := &passRig{t: t, st: &hookedStore{Store: st}, r: r}
	reg := g.register(1, "10.0.0.1:80")
	if _, err := st.Delete(context.Background(), reg.key); err != nil {
		t.Fatal(err)
	}
	if n, err := g.pass(verifyAll); err != nil || n != 1 {
		t.Fatalf("pass wrote %d keys (%v), want 1", n, err)
	}
	select {
	case <-vanished:
	default:
		t.Fatal("a key that vanished was written again without a word")
	}
}
