package registry

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// The group-commit batcher on its own, over a real memory store. The
// oracle is the store itself (what a Get returns), never the batcher's
// bookkeeping.

type batcherRig struct {
	st        *memory.Store
	lease     store.LeaseID
	txns      atomic.Int32     // transactions sent to the store
	closed    atomic.Bool      // spawn refuses once set
	wg        sync.WaitGroup   // spawned goroutines
	undone    chan string      // keys undo was asked to delete
	beforeTxn func([]store.Op) // runs before each transaction reaches the store
}

func newBatcherRig(t *testing.T) (*batcherRig, *batcher) {
	t.Helper()
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	l, err := st.Grant(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rig := &batcherRig{st: st, lease: l.ID, undone: make(chan string, 16)}
	b := newBatcher(batcherDeps{
		txn: func(ctx context.Context, ops ...store.Op) (int64, error) {
			rig.txns.Add(1)
			if rig.beforeTxn != nil {
				rig.beforeTxn(ops)
			}
			return st.Txn(ctx, ops...)
		},
		spawn: func(fn func()) bool {
			if rig.closed.Load() {
				return false
			}
			rig.wg.Add(1)
			go func() { defer rig.wg.Done(); fn() }()
			return true
		},
		opContext: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Minute)
		},
		undo: func(key string, rev int64) {
			_, _ = st.Delete(context.Background(), key, store.IfModRevision(rev))
			rig.undone <- key
		},
	})
	t.Cleanup(rig.wg.Wait)
	return rig, b
}

// stored reports whether key holds val under the rig's lease.
func (rig *batcherRig) stored(t *testing.T, key string) bool {
	t.Helper()
	kv, err := rig.st.Get(context.Background(), key)
	if errors.Is(err, store.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	if kv.Lease != rig.lease {
		t.Fatalf("%s bound to lease %x, want %x", key, kv.Lease, rig.lease)
	}
	return true
}

func (rig *batcherRig) ops(keys ...string) []*createOp {
	out := make([]*createOp, len(keys))
	for i, k := range keys {
		out[i] = newCreateOp(k, []byte("v-"+k), rig.lease)
	}
	return out
}

// A lone create is sent at once, in one transaction of its own.
func TestBatcherLoneCreateIsOneTransaction(t *testing.T) {
	rig, b := newBatcherRig(t)
	rev, err := b.create(context.Background(), "k", []byte("v"), rig.lease)
	if err != nil || rev == 0 {
		t.Fatalf("create = %d, %v", rev, err)
	}
	if n := rig.txns.Load(); n != 1 {
		t.Fatalf("%d transactions for one create, want 1", n)
	}
	if !rig.stored(t, "k") {
		t.Fatal("k not in the store")
	}
}

// A create of a key that exists fails with ErrKeyExists; the others of
// its batch are written all the same.
func TestBatcherConflictFailsOnlyItsKey(t *testing.T) {
	rig, b := newBatcherRig(t)
	if _, err := rig.st.Create(context.Background(), "b", []byte("someone"), store.WithLease(rig.lease)); err != nil {
		t.Fatal(err)
	}
	batch := rig.ops("a", "b", "c")
	b.commit(slices.Clone(batch)) // commit owns its batch (filters it in place)
	for _, op := range batch {
		<-op.done
	}
	if !errors.Is(batch[1].err, store.ErrKeyExists) {
		t.Fatalf("b: err %v, want ErrKeyExists", batch[1].err)
	}
	for _, op := range []*createOp{batch[0], batch[2]} {
		if op.err != nil || op.rev == 0 || !rig.stored(t, op.key) {
			t.Fatalf("%s: rev %d err %v stored %v, want written", op.key, op.rev, op.err, rig.stored(t, op.key))
		}
	}
}

// A transaction that fails otherwise fails every create of its batch, and
// none is written.
func TestBatcherStoreErrorFailsTheBatch(t *testing.T) {
	rig, b := newBatcherRig(t)
	boom := errors.New("boom")
	b.txn = func(context.Context, ...store.Op) (int64, error) { return 0, boom }
	batch := rig.ops("a", "b")
	b.commit(slices.Clone(batch))
	for _, op := range batch {
		<-op.done
		if !errors.Is(op.err, boom) || rig.stored(t, op.key) {
			t.Fatalf("%s: err %v, want the store's error and nothing written", op.key, op.err)
		}
	}
}

// A conflict that names no key of the batch fails the whole batch (no
// endless retry).
func TestBatcherConflictOnAnUnknownKeyFailsTheBatch(t *testing.T) {
	rig, b := newBatcherRig(t)
	other := &store.ConflictError{Key: "not-ours", Err: store.ErrKeyExists}
	b.txn = func(context.Context, ...store.Op) (int64, error) { rig.txns.Add(1); return 0, other }
	batch := rig.ops("a", "b")
	b.commit(slices.Clone(batch))
	for _, op := range batch {
		<-op.done
		if !errors.As(op.err, new(*store.ConflictError)) {
			t.Fatalf("%s: err %v, want the conflict", op.key, op.err)
		}
	}
	if n := rig.txns.Load(); n != 1 {
		t.Fatalf("%d transactions, want 1", n)
	}
}

// A create its caller gave up on before it was sent is not written.
func TestBatcherAbandonedBeforeSendIsNotWritten(t *testing.T) {
	rig, b := newBatcherRig(t)
	batch := rig.ops("a", "b")
	batch[0].state.Store(opAbandoned)
	b.commit(slices.Clone(batch))
	<-batch[0].done
	<-batch[1].done
	if rig.stored(t, "a") {
		t.Fatal("an abandoned create was written")
	}
	if !rig.stored(t, "b") {
		t.Fatal("b not written")
	}
	// All abandoned: no transaction at all.
	before := rig.txns.Load()
	gone := rig.ops("c")
	gone[0].state.Store(opAbandoned)
	b.commit(slices.Clone(gone))
	<-gone[0].done
	if rig.txns.Load() != before || rig.stored(t, "c") {
		t.Fatal("a batch of abandoned creates reached the store")
	}
}

// A create its caller gave up on while its transaction was in flight is
// undone: nothing stays behind that no registration tracks.
func TestBatcherAbandonedInFlightIsUndone(t *testing.T) {
	rig, b := newBatcherRig(t)
	batch := rig.ops("a", "b")
	rig.beforeTxn = func([]store.Op) { batch[0].state.CompareAndSwap(opPending, opAbandoned) }
	b.commit(slices.Clone(batch))
	<-batch[1].done
	select {
	case k := <-rig.undone:
		if k != "a" {
			t.Fatalf("undid %s, want a", k)
		}
	case <-time.After(time.Minute):
		t.Fatal("the abandoned write was not undone")
	}
	if rig.stored(t, "a") || !rig.stored(t, "b") {
		t.Fatalf("after the undo: a stored %v, b stored %v; want only b", rig.stored(t, "a"), rig.stored(t, "b"))
	}
}

// An op whose caller gave up is never recycled: the token its
// transaction's end sends it must not wake the next create, nor may it be
// written as if still wanted.
func TestBatcherAbandonedOpIsNotReused(t *testing.T) {
	rig, b := newBatcherRig(t)
	b.inflight = maxInflight // nothing may start: the create waits
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := b.create(ctx, "gone", []byte("v"), rig.lease)
		errc <- err
	}()
	for deadline := time.Now().Add(time.Minute); ; runtime.Gosched() {
		b.mu.Lock()
		queued := len(b.queue)
		b.mu.Unlock()
		if queued == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the create never queued")
		}
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("create = %v, want context.Canceled", err)
	}
	b.finished(0) // a slot frees: the abandoned op is taken, and dropped
	rig.wg.Wait()
	b.inflight = 0
	if rig.txns.Load() != 0 || rig.stored(t, "gone") {
		t.Fatal("an abandoned create reached the store")
	}
	for _, key := range []string{"next", "after"} {
		rev, err := b.create(context.Background(), key, []byte("v"), rig.lease)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := rig.st.Get(context.Background(), key)
		if err != nil || kv.ModRevision != rev {
			t.Fatalf("create(%s) = rev %d; stored %+v, %v: want its own write's revision", key, rev, kv, err)
		}
	}
}

// A caller whose context ends before its create is sent gets the
// context's error.
func TestBatcherCallerContextEnded(t *testing.T) {
	rig, b := newBatcherRig(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.create(ctx, "a", []byte("v"), rig.lease); !errors.Is(err, context.Canceled) {
		t.Fatalf("create = %v, want context.Canceled", err)
	}
	if rig.txns.Load() != 0 || rig.stored(t, "a") {
		t.Fatal("a create whose context had ended reached the store")
	}
}

// What waits while a transaction is in flight is sent when it ends, by a
// goroutine the registry owns; once the registry is closed it fails with
// ErrClosed instead of waiting forever.
func TestBatcherQueuedSentWhenInflightEnds(t *testing.T) {
	for _, closed := range []bool{false, true} {
		t.Run(fmt.Sprintf("closed=%v", closed), func(t *testing.T) {
			rig, b := newBatcherRig(t)
			b.inflight, b.flying = 1, 1 // one transaction in flight
			q := rig.ops("a", "b")
			b.queue = append(b.queue, q...)
			rig.closed.Store(closed)
			b.finished(1)
			for _, op := range q {
				<-op.done
				switch {
				case closed && !errors.Is(op.err, ErrClosed):
					t.Fatalf("%s: err %v, want ErrClosed", op.key, op.err)
				case !closed && (op.err != nil || !rig.stored(t, op.key)):
					t.Fatalf("%s: err %v stored %v, want written", op.key, op.err, rig.stored(t, op.key))
				}
			}
			rig.wg.Wait()
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.inflight != 0 || b.flying != 0 || len(b.queue) != 0 {
				t.Fatalf("after: inflight %d flying %d queue %d, want all 0", b.inflight, b.flying, len(b.queue))
			}
		})
	}
}

// takeLocked's rule, case by case: the batch size it takes (0: waits).
func TestBatcherTakeRule(t *testing.T) {
	cases := []struct {
		name                          string
		queue, inflight, flying, peak int
		want, wantPeak                int
	}{
		{"idle: a lone create goes at once", 1, 0, 0, 0, 1, 0},
		{"in flight: below the share waits", 1, 1, 8, 0, 0, 9},
		{"in flight: the share of the peak goes", 8, 1, 8, 0, 8, 16 - 2},
		{"peak, not the instant's count, sets the share", 5, 1, 0, 12, 0, 12},
		{"the share rounds up: a peak of 9 makes 5, so 4 wait", 4, 1, 0, 9, 0, 9},
		{"share capped at targetBatch", targetBatch, 1, 1000, 0, targetBatch, 1000 + targetBatch - (1000+targetBatch+7)/8},
		{"below targetBatch with a huge peak waits", targetBatch - 1, 1, 1000, 0, 0, 1000 + targetBatch - 1},
		{"maxInflight reached waits", 100, maxInflight, 100, 0, 0, 0},
		{"a batch is at most maxTxnOps", 300, 0, 0, 0, maxTxnOps, 300 - (300+7)/8},
		{"empty queue: nothing", 0, 0, 0, 5, 0, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := &batcher{inflight: c.inflight, flying: c.flying, peak: c.peak}
			for i := range c.queue {
				b.queue = append(b.queue, &createOp{key: fmt.Sprint(i)})
			}
			got := b.takeLocked()
			if len(got) != c.want {
				t.Fatalf("took %d, want %d", len(got), c.want)
			}
			if b.peak != c.wantPeak {
				t.Fatalf("peak %d, want %d", b.peak, c.wantPeak)
			}
			wantInflight, wantFlying := c.inflight, c.flying
			if c.want > 0 {
				wantInflight, wantFlying = c.inflight+1, c.flying+c.want
				for i, op := range got {
					if op.key != fmt.Sprint(i) {
						t.Fatalf("batch[%d] = %s, want the queue's order", i, op.key)
					}
				}
			}
			if b.inflight != wantInflight || b.flying != wantFlying || len(b.queue) != c.queue-c.want {
				t.Fatalf("inflight %d flying %d queue %d, want %d %d %d", b.inflight, b.flying, len(b.queue), wantInflight, wantFlying, c.queue-c.want)
			}
		})
	}
}

// Concurrent creates all land.
func TestBatcherConcurrentCreatesAllLand(t *testing.T) {
	rig, b := newBatcherRig(t)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if _, err := b.create(context.Background(), fmt.Sprintf("k%03d", i), []byte("v"), rig.lease); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	kvs, _, err := rig.st.List(context.Background(), "k")
	if err != nil || len(kvs) != n {
		t.Fatalf("store holds %d keys (%v), want %d", len(kvs), err, n)
	}
	t.Logf("%d creates in %d transactions", n, rig.txns.Load())
}

// An abandoned create whose transaction failed wrote nothing: there is
// nothing to undo, and undo is not asked.
func TestBatcherAbandonedAndFailedIsNotUndone(t *testing.T) {
	rig, b := newBatcherRig(t)
	batch := rig.ops("a", "b")
	refused := errors.New("refused")
	b.txn = func(context.Context, ...store.Op) (int64, error) {
		batch[0].state.CompareAndSwap(opPending, opAbandoned)
		return 0, refused
	}
	b.commit(slices.Clone(batch))
	<-batch[0].done
	<-batch[1].done
	if !errors.Is(batch[1].err, refused) {
		t.Fatalf("the failed transaction's other create ended with %v, want its error", batch[1].err)
	}
	select {
	case k := <-rig.undone:
		t.Fatalf("undo asked for %s, which no transaction wrote", k)
	default:
	}
}
