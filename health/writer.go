package health

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
)

// writeWorkers bounds the verdict writes in flight at once, for all
// instances together (each instance has at most one).
const writeWorkers = 8

// verdictWriter keeps this checker's verdicts in its backend (sink.go): in
// the store, each at Keyspace.HealthKey(ref), as beacon.Health JSON, bound
// to a lease the writer grants itself and keeps alive (so that a checker
// that dies takes its verdicts with it); or in a registry's VerdictSink. It writes a verdict when it changes, never per
// probe; when the lease is lost it grants a new one and writes every
// verdict of the instances it owns again.
//
// Each instance has a slot: what its Runner said last (want) and what the
// store holds of it (have). A change queues the slot; writeWorkers
// goroutines take slots from the queue, one write per slot at a time, and
// the keeper goroutine renews the lease every TTL/3 and sweeps the slots
// whose write failed or whose deletion is due into the queue again.
type verdictWriter struct {
	back  verdictBackend // the store, or a registry's sink (sink.go)
	ttl   time.Duration
	grace time.Duration // how long a verdict outlives its instance
	log   *slog.Logger

	kick chan struct{} // wakes a worker per slot queued, up to all of them
	lost chan struct{} // wakes the keeper: the lease ended

	mu      sync.Mutex
	lease   store.LeaseID // store.NoLease while there is none
	holding bool          // write no failing verdict (cutoff.go) ...
	cutOff  bool          // ... and withdraw those written
	slots   map[beacon.Ref]*slot
	queue   []beacon.Ref
}

// slot is one instance's verdict as this checker knows it.
type slot struct {
	owned   bool          // this checker runs the instance's Runner ...
	runner  uint64        // ... this one (see own)
	want    beacon.Health // the Runner's latest verdict (Status "" before the first)
	wantGen uint64        // counts changes of want
	haveGen uint64        // the wantGen last written ...
	under   store.LeaseID // ... under this lease
	failing bool          // what the store holds of ours is a failing verdict
	// withdraw: delete our failing verdict (cut off).
	withdraw bool
	// goneAt: the instance is gone, or declares no check: delete our
	// verdict once grace has passed.
	goneAt       time.Time
	queued, busy bool
}

// opKind is what a slot needs done in the store.
type opKind uint8

const (
	opNone     opKind = iota
	opPut             // write want under the lease
	opWithdraw        // delete our failing verdict
	opDelete          // delete our verdict, the instance is gone
)

type op struct {
	kind  opKind
	h     beacon.Health
	gen   uint64
	lease store.LeaseID
}

func newVerdictWriter(back verdictBackend, ttl time.Duration, log *slog.Logger) *verdictWriter {
	return &verdictWriter{back: back, ttl: ttl, grace: ttl, log: log,
		kick: make(chan struct{}, writeWorkers), lost: make(chan struct{}, 1), slots: map[beacon.Ref]*slot{}}
}

// callTimeout bounds each store call.
func (w *verdictWriter) callTimeout() time.Duration {
	return min(max(w.ttl/3, time.Second), 5*time.Second)
}

// own starts a slot for an instance this checker now owns, run by a new
// Runner, and returns that Runner's token for set: the first verdict of
// the new Runner is written whatever the store holds, and the results of
// a Runner stopped before it are not.
func (w *verdictWriter) own(ref beacon.Ref) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.slots[ref]
	if s == nil {
		s = &slot{}
		w.slots[ref] = s
	}
	s.owned, s.goneAt = true, time.Time{}
	s.want = beacon.Health{}
	s.wantGen++
	s.runner++
	return s.runner
}

// disown stops writing the instance's verdicts (another checker owns it
// now): the verdict stays until the new owner writes its own.
func (w *verdictWriter) disown(ref beacon.Ref) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.slots[ref]; s != nil {
		s.owned, s.goneAt = false, time.Time{}
		if !s.busy && (s.haveGen == 0 || s.under != w.lease) {
			delete(w.slots, ref) // nothing of ours in the store
		}
	}
}

// gone schedules the deletion of our verdict on an instance that is gone
// or declares no check any more, grace from now (it may come back with
// the same ID: a registrant that lost its lease).
func (w *verdictWriter) gone(ref beacon.Ref) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.slots[ref]; s != nil {
		s.owned, s.goneAt = false, time.Now()
	}
}

// drop deletes our verdict on an instance another checker owns, now that
// the new owner's own verdict shows (a backend that keeps each checker's
// verdicts apart: nothing overwrites ours, and kept it would come back
// should the new owner die).
func (w *verdictWriter) drop(ref beacon.Ref) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.slots[ref]; s != nil && !s.owned {
		s.goneAt = time.Now().Add(-w.grace)
		w.enqueueLocked(ref, s)
	}
}

// set records the new verdict of the owned instance's Runner (its token
// from own) and queues its write.
func (w *verdictWriter) set(ref beacon.Ref, runner uint64, h beacon.Health) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.slots[ref]
	if s == nil || !s.owned || s.runner != runner {
		return // that Runner was stopped meanwhile
	}
	s.want = h
	s.wantGen++
	w.enqueueLocked(ref, s)
}

// hold stops the writing of failing verdicts (a checker that cannot yet
// tell, or that is cut off); withdraw also deletes those in the store.
func (w *verdictWriter) hold(withdraw bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.holding, w.cutOff = true, withdraw
	if !withdraw {
		return
	}
	for ref, s := range w.slots {
		if s.failing && s.under == w.lease {
			s.withdraw = true
			w.enqueueLocked(ref, s)
		}
	}
}

// release writes the failing verdicts held.
func (w *verdictWriter) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.holding {
		return
	}
	w.holding, w.cutOff = false, false
	for ref, s := range w.slots {
		w.enqueueLocked(ref, s)
	}
}

// nextLocked is what the slot needs done now.
func (w *verdictWriter) nextLocked(s *slot, now time.Time) op {
	switch {
	case !s.goneAt.IsZero():
		if now.Sub(s.goneAt) >= w.grace {
			return op{kind: opDelete}
		}
		return op{}
	case s.withdraw:
		return op{kind: opWithdraw}
	case s.owned && s.want.Status != "" && w.lease != store.NoLease &&
		!(w.holding && s.want.Status == beacon.HealthFailing) &&
		(s.haveGen != s.wantGen || s.under != w.lease):
		return op{kind: opPut, h: s.want, gen: s.wantGen, lease: w.lease}
	}
	return op{}
}

func (w *verdictWriter) enqueueLocked(ref beacon.Ref, s *slot) {
	if s.queued || s.busy || w.nextLocked(s, time.Now()).kind == opNone {
		return
	}
	s.queued = true
	w.queue = append(w.queue, ref)
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// sweep queues every slot with work to do: writes that failed, deletions
// now due.
func (w *verdictWriter) sweep() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ref, s := range w.slots {
		w.enqueueLocked(ref, s)
	}
}

// work takes slots from the queue and does what they need until ctx ends.
func (w *verdictWriter) work(ctx context.Context) {
	for {
		ref, o, ok := w.take(ctx)
		if !ok {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, w.callTimeout())
		err := w.do(cctx, ref, o)
		cancel()
		w.finish(ref, o, err)
	}
}

// take waits for a queued slot with work and marks it busy.
func (w *verdictWriter) take(ctx context.Context) (beacon.Ref, op, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		for len(w.queue) == 0 {
			w.mu.Unlock()
			select {
			case <-w.kick:
			case <-ctx.Done():
				w.mu.Lock()
				return beacon.Ref{}, op{}, false
			}
			w.mu.Lock()
		}
		ref := w.queue[0]
		w.queue = w.queue[1:]
		s := w.slots[ref]
		if s == nil {
			continue
		}
		s.queued = false
		if o := w.nextLocked(s, time.Now()); o.kind != opNone {
			s.busy = true
			return ref, o, true
		}
	}
}

// do makes the backend call of o.
func (w *verdictWriter) do(ctx context.Context, ref beacon.Ref, o op) error {
	switch o.kind {
	case opPut:
		return w.back.put(ctx, ref, o.h, o.lease)
	case opWithdraw:
		return w.back.deleteOurs(ctx, ref, func(h beacon.Health) bool { return h.Status == beacon.HealthFailing })
	case opDelete:
		return w.back.deleteOurs(ctx, ref, func(beacon.Health) bool { return true })
	}
	return nil
}

// finish records the outcome of o. A failed write is retried by the next
// sweep, not at once (the store may be down).
func (w *verdictWriter) finish(ref beacon.Ref, o op, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.slots[ref]
	if s == nil {
		return // dropped meanwhile (the lease ended)
	}
	s.busy = false
	if err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			w.loseLocked(o.lease)
		}
		w.log.Debug("writing a verdict failed; retrying", "instance", ref.String(), "err", err)
		return
	}
	switch o.kind {
	case opPut:
		s.haveGen, s.under, s.failing = o.gen, o.lease, o.h.Status == beacon.HealthFailing
		s.withdraw = s.failing && w.cutOff // written as the checker found itself cut off
	case opWithdraw:
		s.withdraw, s.failing, s.haveGen = false, false, 0
		if !s.owned {
			delete(w.slots, ref)
			return
		}
	case opDelete:
		delete(w.slots, ref)
		return
	}
	w.enqueueLocked(ref, s) // changed while it was written
}

// loseLocked forgets the lease l, which ended with every verdict bound to
// it: the slots of instances this checker no longer owns go, the others
// are written again under the next lease.
func (w *verdictWriter) loseLocked(l store.LeaseID) {
	if w.lease != l || l == store.NoLease {
		return
	}
	w.log.Warn("the checker's verdict lease ended (its verdicts with it); granting a new one and writing them again", "lease", int64(l))
	w.lease = store.NoLease
	for ref, s := range w.slots {
		if !s.owned {
			delete(w.slots, ref)
			continue
		}
		s.failing, s.withdraw = false, false
	}
	select {
	case w.lost <- struct{}{}:
	default:
	}
}

// keep grants the lease, renews it every TTL/3 and sweeps the slots,
// until ctx ends.
func (w *verdictWriter) keep(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		if !w.grant(ctx) {
			return
		}
		t.Reset(w.ttl / 3)
		select {
		case <-ctx.Done():
			return
		case <-w.lost:
			continue
		case <-t.C:
		}
		w.renew(ctx)
		w.sweep()
	}
}

// grant grants a lease if there is none, retrying with capped backoff,
// and reports false once ctx ends.
func (w *verdictWriter) grant(ctx context.Context) bool {
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, w.ttl/3) {
		w.mu.Lock()
		have := w.lease != store.NoLease
		w.mu.Unlock()
		if have {
			return true
		}
		cctx, cancel := context.WithTimeout(ctx, w.callTimeout())
		l, err := w.back.grant(cctx, w.ttl)
		cancel()
		if err == nil {
			w.mu.Lock()
			w.lease = l
			w.mu.Unlock()
			w.sweep()
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		w.log.Warn("cannot grant the checker's verdict lease; retrying (verdicts wait)", "err", err)
		if !wait.Sleep(ctx, delay) {
			return false
		}
	}
}

// renew keeps the lease alive once.
func (w *verdictWriter) renew(ctx context.Context) {
	w.mu.Lock()
	l := w.lease
	w.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, w.callTimeout())
	err := w.back.keepAlive(cctx, l)
	cancel()
	switch {
	case errors.Is(err, store.ErrLeaseNotFound):
		w.mu.Lock()
		w.loseLocked(l)
		w.mu.Unlock()
	case err != nil && ctx.Err() == nil:
		w.log.Warn("cannot renew the checker's verdict lease; retrying", "err", err)
	}
}

// revoke ends the lease, and with it every verdict of this checker, at
// Close: the instances it checked are served again until another checker
// reaches its verdict (fail-open).
func (w *verdictWriter) revoke() {
	w.mu.Lock()
	l := w.lease
	w.lease = store.NoLease
	w.mu.Unlock()
	if l == store.NoLease {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.ttl)
	defer cancel()
	if err := w.back.revoke(ctx, l); err != nil && !errors.Is(err, store.ErrLeaseNotFound) {
		w.log.Warn("cannot revoke the checker's verdict lease; its verdicts expire with it", "err", err, "ttl", w.ttl)
	}
}
