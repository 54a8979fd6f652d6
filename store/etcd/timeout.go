package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// errRequestTimeout is the cancellation cause of a call that ran past
// RequestTimeout.
var errRequestTimeout = errors.New("etcd: request timeout")

// ticksPerTimeout is how finely the watchdog measures RequestTimeout: a
// call ends between RequestTimeout and 9/8 of it.
const ticksPerTimeout = 8

// watchdog bounds the calls whose context has no deadline. A deadline per
// call (context.WithTimeout) costs a timer on the client, a grpc-timeout
// header and a second timer in the server, for every call; measured against
// the raw client that was several percent of a Put. Instead each such call
// gets a plain cancellable context and the tick it started at, and one
// goroutine per Store cancels the calls that have run for RequestTimeout.
// Close cancels every call still running.
type watchdog struct {
	tick  atomic.Int64 // advanced every timeout/ticksPerTimeout
	mu    sync.Mutex
	calls map[*timedCall]struct{}
	done  bool
}

type timedCall struct {
	start  int64
	cancel context.CancelCauseFunc
}

// begin returns the context of a call and the function that ends it.
func (w *watchdog) begin(ctx context.Context) (context.Context, func()) {
	c, cancel := context.WithCancelCause(ctx)
	tc := &timedCall{start: w.tick.Load(), cancel: cancel}
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		cancel(errClosedDuringCall)
		return c, func() {}
	}
	w.calls[tc] = struct{}{}
	w.mu.Unlock()
	return c, func() {
		w.mu.Lock()
		delete(w.calls, tc)
		w.mu.Unlock()
		cancel(nil)
	}
}

// errClosedDuringCall is the cancellation cause of calls Close ended.
var errClosedDuringCall = errors.New("etcd: store closed during the call")

// run advances the tick and cancels overdue calls until stop is closed,
// then cancels every call left.
func (w *watchdog) run(timeout time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(max(timeout/ticksPerTimeout, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			w.mu.Lock()
			w.done = true
			for tc := range w.calls {
				tc.cancel(errClosedDuringCall)
			}
			clear(w.calls)
			w.mu.Unlock()
			return
		case <-t.C:
		}
		now := w.tick.Add(1)
		w.mu.Lock()
		for tc := range w.calls {
			// Started at tick start, so it has run more than
			// now-start-1 ticks: cancel once that reaches the timeout.
			if now-tc.start > ticksPerTimeout {
				tc.cancel(errRequestTimeout)
				delete(w.calls, tc)
			}
		}
		w.mu.Unlock()
	}
}
