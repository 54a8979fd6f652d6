package health

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// waitFor bounds every wait of the checker's tests.
const waitFor = 30 * time.Second

func newMemoryStore(t *testing.T) *memory.Store {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// runWriter runs a verdict writer over st (TTL 1 s) until the test ends.
func runWriter(t *testing.T, st store.Store, id string) *verdictWriter {
	t.Helper()
	return runWriterTTL(t, st, id, time.Second)
}

func runWriterTTL(t *testing.T, st store.Store, id string, ttl time.Duration) *verdictWriter {
	t.Helper()
	w := newVerdictWriter(&storeVerdicts{st: st, id: id}, ttl, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1 + writeWorkers)
	go func() { defer wg.Done(); w.keep(ctx) }()
	for range writeWorkers {
		go func() { defer wg.Done(); w.work(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait(); w.revoke() })
	return w
}

// awaitKey waits until the key's value (nil: absent) satisfies ok, and
// returns it.
func awaitKey(t *testing.T, st store.Store, key string, what string, ok func(*store.KeyValue) bool) *store.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	kvs, rev, err := st.List(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var cur *store.KeyValue
	for i := range kvs {
		if kvs[i].Key == key {
			cur = &kvs[i]
		}
	}
	if ok(cur) {
		return cur
	}
	for resp := range st.Watch(ctx, key, rev+1) {
		if resp.Err != nil {
			t.Fatalf("waiting for %s at %s: %v", what, key, resp.Err)
		}
		for _, e := range resp.Events {
			if e.KV.Key != key {
				continue
			}
			cur = nil
			if e.Type == store.EventPut {
				kv := e.KV
				cur = &kv
			}
			if ok(cur) {
				return cur
			}
		}
	}
	t.Fatalf("no %s at %s within %v", what, key, waitFor)
	return nil
}

// verdictOf decodes a stored verdict (nil: none).
func verdictOf(t *testing.T, kv *store.KeyValue) *beacon.Health {
	t.Helper()
	if kv == nil {
		return nil
	}
	if strings.Contains(string(kv.Value), "panic") {
		t.Fatalf("a verdict carries panic: %s", kv.Value)
	}
	var h beacon.Health
	if err := json.Unmarshal(kv.Value, &h); err != nil {
		t.Fatalf("verdict %s: %v", kv.Value, err)
	}
	return &h
}

// isVerdict matches a stored verdict of status by checker.
func isVerdict(t *testing.T, status beacon.HealthStatus, checker string) func(*store.KeyValue) bool {
	return func(kv *store.KeyValue) bool {
		h := verdictOf(t, kv)
		return h != nil && h.Status == status && h.Checker == checker
	}
}

func absent(kv *store.KeyValue) bool { return kv == nil }

func failingVerdict(id, reason string) beacon.Health {
	return beacon.Health{Status: beacon.HealthFailing, Reason: reason, Since: time.Now().UTC(), Checker: id}
}

func passingVerdict(id string) beacon.Health {
	return beacon.Health{Status: beacon.HealthPassing, Since: time.Now().UTC(), Checker: id}
}

// TestWriterWritesUnderItsLease: a verdict is written as beacon.Health
// JSON at the instance's health key, bound to the writer's own lease.
func TestWriterWritesUnderItsLease(t *testing.T) {
	st := newMemoryStore(t)
	w := runWriter(t, st, "a")
	ref := testRef(0)
	w.set(ref, w.own(ref), failingVerdict("a", "connection refused"))
	kv := awaitKey(t, st, beacon.Keyspace{}.HealthKey(ref), "a failing verdict", isVerdict(t, beacon.HealthFailing, "a"))
	w.mu.Lock()
	lease := w.lease
	w.mu.Unlock()
	if h := verdictOf(t, kv); kv.Lease != lease || h.Reason != "connection refused" || h.Since.IsZero() {
		t.Fatalf("stored %s under lease %d, want the writer's lease %d with reason and since", kv.Value, kv.Lease, lease)
	}
}

// writeThenRevoke has w write a passing verdict of a new Runner on ref,
// then revokes the lease it is bound to; it returns the verdict as it was
// written, and the Runner's token.
func writeThenRevoke(t *testing.T, st store.Store, w *verdictWriter, ref beacon.Ref) (*store.KeyValue, uint64) {
	t.Helper()
	runner := w.own(ref)
	w.set(ref, runner, passingVerdict("a"))
	kv := awaitKey(t, st, beacon.Keyspace{}.HealthKey(ref), "a passing verdict", isVerdict(t, beacon.HealthPassing, "a"))
	if err := st.Revoke(context.Background(), kv.Lease); err != nil {
		t.Fatal(err)
	}
	return kv, runner
}

// TestWriterRewritesAfterLeaseLoss: when its lease ends (and its verdicts
// with it), the writer grants a new one and writes the verdicts again.
func TestWriterRewritesAfterLeaseLoss(t *testing.T) {
	st := newMemoryStore(t)
	w := runWriter(t, st, "a")
	ref := testRef(0)
	key := beacon.Keyspace{}.HealthKey(ref)
	kv, _ := writeThenRevoke(t, st, w, ref)
	again := awaitKey(t, st, key, "the verdict written again", isVerdict(t, beacon.HealthPassing, "a"))
	if again.Lease == kv.Lease {
		t.Fatalf("rewritten under the revoked lease %d", kv.Lease)
	}
}

// gatedStore holds every Put until the test lets it through, and counts
// Puts in flight.
type gatedStore struct {
	store.Store
	entered  chan struct{}
	release  chan struct{}
	puts     atomic.Int64
	inFlight atomic.Int64
	maxIn    atomic.Int64
}

func (g *gatedStore) Put(ctx context.Context, key string, v []byte, opts ...store.WriteOption) (int64, error) {
	g.puts.Add(1)
	n := g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	for m := g.maxIn.Load(); n > m && !g.maxIn.CompareAndSwap(m, n); m = g.maxIn.Load() {
	}
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return g.Store.Put(ctx, key, v, opts...)
}

// TestWriterOneWriteInFlightPerInstance: changes that come while an
// instance's verdict is being written wait for that write, and only the
// latest is written after it.
func TestWriterOneWriteInFlightPerInstance(t *testing.T) {
	g := &gatedStore{Store: newMemoryStore(t), entered: make(chan struct{}, 16), release: make(chan struct{})}
	w := runWriter(t, g, "a")
	ref := testRef(0)
	runner := w.own(ref)
	w.set(ref, runner, failingVerdict("a", "first"))
	<-g.entered
	for i := range 9 {
		w.set(ref, runner, failingVerdict("a", "change "+string(rune('1'+i))))
	}
	close(g.release)
	awaitKey(t, g.Store, beacon.Keyspace{}.HealthKey(ref), "the last change", func(kv *store.KeyValue) bool {
		h := verdictOf(t, kv)
		return h != nil && h.Reason == "change 9"
	})
	if g.puts.Load() != 2 || g.maxIn.Load() != 1 {
		t.Fatalf("%d puts, at most %d at once; want 2 (the first and the last change), one at a time", g.puts.Load(), g.maxIn.Load())
	}
}

// TestWriterDeletesOnlyItsOwnVerdict: the verdict of an instance that is
// gone is deleted if it still names this checker, with compare-and-delete;
// another checker's stays.
func TestWriterDeletesOnlyItsOwnVerdict(t *testing.T) {
	st := newMemoryStore(t)
	w := runWriter(t, st, "a")
	ctx := context.Background()
	mine, theirs := testRef(0), testRef(1)
	for _, ref := range []beacon.Ref{mine, theirs} {
		w.set(ref, w.own(ref), passingVerdict("a"))
		awaitKey(t, st, beacon.Keyspace{}.HealthKey(ref), "a passing verdict", isVerdict(t, beacon.HealthPassing, "a"))
	}
	b, _ := json.Marshal(passingVerdict("b")) // the new owner's
	if _, err := st.Put(ctx, beacon.Keyspace{}.HealthKey(theirs), b); err != nil {
		t.Fatal(err)
	}
	if err := w.back.deleteOurs(ctx, theirs, func(beacon.Health) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, beacon.Keyspace{}.HealthKey(theirs)); err != nil {
		t.Fatalf("another checker's verdict was deleted: %v", err)
	}
	w.gone(mine)
	awaitKey(t, st, beacon.Keyspace{}.HealthKey(mine), "the deletion of the gone instance's verdict", absent)
}

// TestWriterDisownKeepsVerdict: an instance handed over to another checker
// keeps this one's verdict (the new owner overwrites it), and the writer
// has nothing more to do for it.
func TestWriterDisownKeepsVerdict(t *testing.T) {
	st := newMemoryStore(t)
	w := runWriter(t, st, "a")
	ref := testRef(0)
	runner := w.own(ref)
	w.set(ref, runner, failingVerdict("a", "down"))
	awaitKey(t, st, beacon.Keyspace{}.HealthKey(ref), "a failing verdict", isVerdict(t, beacon.HealthFailing, "a"))
	w.disown(ref)
	w.set(ref, runner, passingVerdict("a")) // a late result of the stopped Runner
	w.mu.Lock()
	s := w.slots[ref]
	next := w.nextLocked(s, time.Now().Add(time.Hour))
	w.mu.Unlock()
	if s == nil || s.owned || next.kind != opNone || s.want.Status != beacon.HealthFailing {
		t.Fatalf("after the handover: slot %+v, next op %d; want a kept, idle slot", s, next.kind)
	}
}

// TestWriterCutOff: cut off, the writer withdraws its failing verdicts
// and writes no new one (passing ones still); connected again, it writes
// the current failing verdicts.
func TestWriterCutOff(t *testing.T) {
	st := newMemoryStore(t)
	w := runWriter(t, st, "a")
	down, up := testRef(0), testRef(1)
	kdown, kup := beacon.Keyspace{}.HealthKey(down), beacon.Keyspace{}.HealthKey(up)
	runDown, runUp := w.own(down), w.own(up)
	w.set(down, runDown, failingVerdict("a", "down"))
	awaitKey(t, st, kdown, "a failing verdict", isVerdict(t, beacon.HealthFailing, "a"))
	w.hold(true)
	awaitKey(t, st, kdown, "the failing verdict withdrawn", absent)
	w.set(up, runUp, failingVerdict("a", "down too"))
	w.set(up, runUp, passingVerdict("a"))
	awaitKey(t, st, kup, "a passing verdict while cut off", isVerdict(t, beacon.HealthPassing, "a"))
	if _, err := st.Get(context.Background(), kdown); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a failing verdict was written while cut off: %v", err)
	}
	w.release()
	awaitKey(t, st, kdown, "the failing verdict written again", isVerdict(t, beacon.HealthFailing, "a"))
}

// TestWriterHoldAndRelease: held, failing verdicts are not written
// (passing ones are); released, they are.
func TestWriterHoldAndRelease(t *testing.T) {
	st := newMemoryStore(t)
	w := runWriter(t, st, "a")
	early, held := testRef(0), testRef(1)
	runs := map[beacon.Ref]uint64{early: w.own(early), held: w.own(held)}
	key := func(ref beacon.Ref) string { return beacon.Keyspace{}.HealthKey(ref) }
	w.set(early, runs[early], failingVerdict("a", "down"))
	awaitKey(t, st, key(early), "a failing verdict", isVerdict(t, beacon.HealthFailing, "a"))
	w.hold(false)
	w.set(held, runs[held], failingVerdict("a", "down"))
	w.set(early, runs[early], passingVerdict("a"))
	awaitKey(t, st, key(early), "a passing verdict while held", isVerdict(t, beacon.HealthPassing, "a"))
	if _, err := st.Get(context.Background(), key(held)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a failing verdict was written while held: %v", err)
	}
	w.release()
	awaitKey(t, st, key(held), "the held failing verdict written", isVerdict(t, beacon.HealthFailing, "a"))
}

// TestWriterWithdrawsWhatLandsCutOff: a failing verdict whose write was
// in flight when the checker found itself cut off is withdrawn once it
// lands.
func TestWriterWithdrawsWhatLandsCutOff(t *testing.T) {
	w := newVerdictWriter(&storeVerdicts{id: "a"}, time.Second, slog.New(slog.DiscardHandler))
	w.lease = 7
	ref := testRef(0)
	w.set(ref, w.own(ref), failingVerdict("a", "down"))
	_, o, _ := w.take(context.Background())
	w.hold(true)
	w.finish(ref, o, nil)
	w.mu.Lock()
	defer w.mu.Unlock()
	if next := w.nextLocked(w.slots[ref], time.Now()); next.kind != opWithdraw {
		t.Fatalf("a failing verdict written as the checker was cut off: next op %d, want its withdrawal", next.kind)
	}
}

// TestWriterIgnoresLossOfAnOldLease: a write under a lease that has since
// been replaced fails with ErrLeaseNotFound; that says nothing of the
// current lease, which stays.
func TestWriterIgnoresLossOfAnOldLease(t *testing.T) {
	w := newVerdictWriter(&storeVerdicts{id: "a"}, time.Second, slog.New(slog.DiscardHandler))
	w.lease = 2
	w.loseLocked(1)
	if w.lease != 2 || len(w.lost) != 0 {
		t.Fatalf("the loss of lease 1 dropped lease 2 (now %d)", w.lease)
	}
	w.loseLocked(2)
	if w.lease != store.NoLease || len(w.lost) != 1 {
		t.Fatalf("the loss of the current lease left lease %d", w.lease)
	}
}

// TestWriterRegrantsAtOnce: a write that finds the lease gone gets a new
// lease granted and the verdicts written at once, not at the next
// renewal (a third of a 30 s TTL later).
func TestWriterRegrantsAtOnce(t *testing.T) {
	st := newMemoryStore(t)
	w := runWriterTTL(t, st, "a", 30*time.Second)
	ref := testRef(0)
	key := beacon.Keyspace{}.HealthKey(ref)
	_, runner := writeThenRevoke(t, st, w, ref)
	start := time.Now()
	w.set(ref, runner, failingVerdict("a", "down"))
	awaitKey(t, st, key, "the verdict under a new lease", isVerdict(t, beacon.HealthFailing, "a"))
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the verdict was written %v after the lease loss was found, want at once", took)
	}
}

// TestWriterIgnoresAStoppedRunner: a result that a stopped Runner (its
// instance's check or address changed, a new Runner took over) reported
// late is not written.
func TestWriterIgnoresAStoppedRunner(t *testing.T) {
	w := newVerdictWriter(&storeVerdicts{id: "a"}, time.Second, slog.New(slog.DiscardHandler))
	w.lease = 1
	ref := testRef(0)
	old := w.own(ref)
	w.own(ref)
	w.set(ref, old, failingVerdict("a", "the old address"))
	if s := w.slots[ref]; s.want.Status != "" || len(w.queue) != 0 {
		t.Fatalf("the stopped Runner's verdict was taken: %+v", s.want)
	}
}

// TestWriterInstanceBack: an instance that is gone comes back (the same
// ID: its registrant recovered its lease) and this checker owns it
// again: its verdict is written, not deleted.
func TestWriterInstanceBack(t *testing.T) {
	w := newVerdictWriter(&storeVerdicts{id: "a"}, time.Second, slog.New(slog.DiscardHandler))
	w.lease = 1
	ref := testRef(0)
	w.set(ref, w.own(ref), passingVerdict("a"))
	w.gone(ref)
	w.set(ref, w.own(ref), failingVerdict("a", "down"))
	if o := w.nextLocked(w.slots[ref], time.Now().Add(time.Hour)); o.kind != opPut {
		t.Fatalf("the next op of the instance back is %d, want its verdict's write", o.kind)
	}
}

// TestWriterWritesInstancesAtOnce: the verdicts of several instances
// queued together are written in parallel, writeWorkers at a time.
func TestWriterWritesInstancesAtOnce(t *testing.T) {
	g := &gatedStore{Store: newMemoryStore(t), entered: make(chan struct{}, 64), release: make(chan struct{})}
	w := newVerdictWriter(&storeVerdicts{st: g, id: "a"}, time.Minute, slog.New(slog.DiscardHandler))
	l, err := g.Grant(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w.lease = l.ID
	for i := range writeWorkers { // queued before any worker runs
		w.set(testRef(i), w.own(testRef(i)), passingVerdict("a"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range writeWorkers {
		wg.Add(1)
		go func() { defer wg.Done(); w.work(ctx) }()
	}
	defer func() { close(g.release); cancel(); wg.Wait() }()
	for range writeWorkers {
		select {
		case <-g.entered:
		case <-time.After(waitFor):
			t.Fatalf("%d writes in flight at once, want %d", g.inFlight.Load(), writeWorkers)
		}
	}
}

// TestWriterForgetsWithdrawnHandover: once the failing verdict of an
// instance it handed over is withdrawn, the writer keeps nothing of it.
func TestWriterForgetsWithdrawnHandover(t *testing.T) {
	w := newVerdictWriter(&storeVerdicts{id: "a"}, time.Second, slog.New(slog.DiscardHandler))
	ref := testRef(0)
	w.slots[ref] = &slot{failing: true, withdraw: true, busy: true}
	w.finish(ref, op{kind: opWithdraw}, nil)
	if s := w.slots[ref]; s != nil {
		t.Fatalf("slot %+v kept after its withdrawal", s)
	}
}
