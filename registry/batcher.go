package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/beaconplane/beacon/store"
)

// batcher commits concurrent creates together (group commit). With
// nothing in flight a create is sent at once; otherwise a transaction
// starts when the creates waiting reach a threshold: an even share of the
// outstanding ones (waiting and in flight) over minInflight transactions,
// at most targetBatch. The share is of the most outstanding lately (peak),
// not of those outstanding at that instant: the callers of a transaction
// that just ended are on their way back, and counting them out made
// batches a quarter smaller than the share (12 instead of 16 with 64
// callers), so etcd ran more, smaller transactions. It takes everything
// waiting (up to maxTxnOps). What waits is sent at the latest when the
// transactions in flight have ended. So a
// lone Register costs one transaction; a few concurrent ones are spread
// over about minInflight transactions; W concurrent ones keep about W keys
// in flight in minInflight transactions of W/minInflight, or in
// transactions as full as one may be (targetBatch) once W/minInflight is
// more, as many as that takes (at most maxInflight), which is how etcd's
// batched-write throughput is
// reached: etcd folds concurrent proposals into one disk sync and applies
// them in order. A transaction that ends takes what waits if the rule
// allows, in a goroutine the registry owns, so that the caller that
// committed it returns.
//
// The batcher knows nothing of the registry: it is given the store's
// transactions, the registry's goroutine owner, its operation bound and
// its undo of an abandoned write (batcherDeps), so that its tests build
// one over a bare store.
type batcher struct {
	batcherDeps
	mu       sync.Mutex
	queue    []*createOp
	inflight int // transactions
	flying   int // creates in them
	// peak is the most creates outstanding lately: the largest count
	// seen, decaying by an eighth (at least one) with every transaction
	// started.
	peak int
}

// batcherDeps is what a batcher uses of its registry.
type batcherDeps struct {
	txn       func(ctx context.Context, ops ...store.Op) (int64, error)
	spawn     func(fn func()) bool // runs fn in an owned goroutine, false once closed
	opContext func() (context.Context, context.CancelFunc)
	undo      func(key string, rev int64) // deletes the write of key at rev unless it changed
}

func newBatcher(d batcherDeps) *batcher { return &batcher{batcherDeps: d} }

const (
	// minInflight is how many transactions the outstanding creates are
	// spread over before batches reach targetBatch: two, so that one
	// fills while the other commits (64 concurrent registrations, fsync:
	// 4 gave 28.1–33.9k/s, 0.69–0.82x of the same-op ceiling, 3 gave
	// 0.76–0.81x, 2 gave 34.9–36.5k/s, 0.82–0.84x; 256 and 1,024 the
	// same either way; beacon bench register, 2026-12-02).
	minInflight = 2
	// targetBatch creates waiting start another transaction: as many as
	// one transaction may hold. At a fixed number of keys in flight one
	// etcd member commits more in fewer, wider transactions: with 48 here
	// 1,024 concurrent registrations ran as about 21 transactions of 48,
	// 47,800/s (fsync), and with 128 as 8 of 128, 64,900/s; 256 as 4 of
	// 64, 51,900/s against 45,200/s (beacon bench register, 2026-12-02).
	targetBatch = maxTxnOps
	// maxInflight bounds the transactions a batcher has in flight.
	maxInflight = 64
)

// createOp is one create waiting for its transaction. Its outcome
// (rev, err) is its caller's once a token arrives on done, which is sent
// exactly once: by finish, or when an abandoned op is dropped unsent.
type createOp struct {
	key   string
	val   []byte
	lease store.LeaseID
	done  chan struct{} // capacity 1
	rev   int64
	err   error
	state atomic.Int32 // opPending, opAbandoned or opDone
}

// createOps recycles ops with their channels: an op and a channel made
// for each registration were a fifth of what a registration allocated
// (1,024 concurrent registrations). A channel of one token, sent rather
// than closed, can be used again.
var createOps = sync.Pool{New: func() any { return &createOp{done: make(chan struct{}, 1)} }}

func newCreateOp(key string, val []byte, lease store.LeaseID) *createOp {
	op := createOps.Get().(*createOp)
	op.key, op.val, op.lease = key, val, lease
	return op
}

// release returns op to createOps once its caller has taken the token
// and the outcome. An abandoned op is never released: its token comes
// after its caller left, and would wake the op's next user.
func (op *createOp) release() {
	op.key, op.val, op.lease, op.rev, op.err = "", nil, 0, 0, nil
	op.state.Store(opPending)
	createOps.Put(op)
}

const (
	opPending int32 = iota
	opAbandoned
	opDone
)

func (b *batcher) create(ctx context.Context, key string, val []byte, lease store.LeaseID) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	op := newCreateOp(key, val, lease)
	b.mu.Lock()
	b.queue = append(b.queue, op)
	batch := b.takeLocked()
	b.mu.Unlock()
	if batch != nil {
		n := len(batch)
		b.commit(batch)
		b.finished(n)
	}
	select {
	case <-op.done:
	case <-ctx.Done():
		if op.state.CompareAndSwap(opPending, opAbandoned) {
			return 0, ctx.Err()
		}
		<-op.done
	}
	rev, err := op.rev, op.err
	op.release()
	return rev, err
}

// takeLocked returns the next batch if a transaction may start, counting
// it in flight; nil otherwise.
func (b *batcher) takeLocked() []*createOp {
	if len(b.queue) == 0 || b.inflight >= maxInflight {
		return nil
	}
	outstanding := len(b.queue) + b.flying
	b.peak = max(b.peak, outstanding)
	threshold := min(targetBatch, (b.peak+minInflight-1)/minInflight)
	if b.inflight > 0 && len(b.queue) < threshold {
		return nil
	}
	b.peak -= (b.peak + 7) / 8
	n := min(len(b.queue), maxTxnOps)
	batch := append([]*createOp(nil), b.queue[:n]...)
	b.queue = b.queue[n:]
	b.inflight++
	b.flying += n
	return batch
}

// finished ends a transaction of n creates; if operations queued
// meanwhile, a goroutine commits them, so that the caller that committed
// returns.
func (b *batcher) finished(n int) {
	b.mu.Lock()
	b.inflight--
	b.flying -= n
	batch := b.takeLocked()
	b.mu.Unlock()
	if batch == nil {
		return
	}
	m := len(batch)
	if !b.spawn(func() {
		b.commit(batch)
		b.finished(m)
	}) {
		for _, op := range batch {
			b.finish(op, 0, ErrClosed)
		}
		b.failAll(ErrClosed)
	}
}

func (b *batcher) failAll(err error) {
	b.mu.Lock()
	q := b.queue
	b.queue = nil
	b.inflight, b.flying, b.peak = 0, 0, 0
	b.mu.Unlock()
	for _, op := range q {
		b.finish(op, 0, err)
	}
}

// commit writes batch, which it owns (it filters it in place), and
// finishes every op of it.
func (b *batcher) commit(batch []*createOp) {
	ctx, cancel := b.opContext()
	defer cancel()
	for len(batch) > 0 {
		// Drop what callers gave up on before it was sent.
		live := batch[:0]
		for _, op := range batch {
			if op.state.Load() == opAbandoned {
				op.done <- struct{}{}
				continue
			}
			live = append(live, op)
		}
		batch = live
		if len(batch) == 0 {
			return
		}
		ops := make([]store.Op, len(batch))
		for i, op := range batch {
			ops[i] = store.Op{Kind: store.OpPut, Key: op.key, Value: op.val, Lease: op.lease, IfAbsent: true}
		}
		rev, err := b.txn(ctx, ops...)
		if err == nil {
			for _, op := range batch {
				b.finish(op, rev, nil)
			}
			return
		}
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			for i, op := range batch {
				if op.key == ce.Key {
					b.finish(op, 0, fmt.Errorf("%w: %q", store.ErrKeyExists, op.key))
					batch = append(batch[:i:i], batch[i+1:]...)
					break
				}
			}
			if len(batch) == len(ops) { // the conflict named no key of ours
				for _, op := range batch {
					b.finish(op, 0, err)
				}
				return
			}
			continue
		}
		for _, op := range batch {
			b.finish(op, 0, err)
		}
		return
	}
}

// finish completes op; a write whose caller gave up meanwhile is undone.
func (b *batcher) finish(op *createOp, rev int64, err error) {
	op.rev, op.err = rev, err
	if !op.state.CompareAndSwap(opPending, opDone) && err == nil {
		b.undo(op.key, rev)
	}
	op.done <- struct{}{}
}
