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
// header and a second timer in the server, for every call: BenchmarkPutDeadline
// measures a Put with its own deadline at 1.014–1.025 times one the watchdog
// bounds (medians of paired Puts, in-process etcd without fsync, 2 cores;
// December 2026), a gain of about 2% of a Put. Instead each such call
// gets a plain cancellable context and the tick it started at, and one
// goroutine per Store cancels the calls that have run for RequestTimeout.
// Close cancels every call still running.
type watchdog struct {
	tick atomic.Int64 // advanced every timeout/ticksPerTimeout
	mu   sync.Mutex
	// The running calls, oldest first: calls are appended with the tick
	// read under mu, so the list is in start order and the watchdog only
	// looks at its front.
	head, tail *timedCall
	done       bool
}

type timedCall struct {
	start      int64
	cancel     context.CancelCauseFunc
	prev, next *timedCall
	listed     bool
}

// begin returns the context of a call and its handle for end.
func (w *watchdog) begin(ctx context.Context) (context.Context, *timedCall) {
	c, cancel := context.WithCancelCause(ctx)
	tc := &timedCall{cancel: cancel}
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		cancel(errClosedDuringCall)
		return c, tc
	}
	tc.start = w.tick.Load()
	tc.listed, tc.prev = true, w.tail
	if w.tail != nil {
		w.tail.next = tc
	} else {
		w.head = tc
	}
	w.tail = tc
	w.mu.Unlock()
	return c, tc
}

// end forgets a call that returned; tc may be nil (a call with its own
// deadline).
func (w *watchdog) end(tc *timedCall) {
	if tc == nil {
		return
	}
	w.mu.Lock()
	w.unlinkLocked(tc)
	w.mu.Unlock()
	tc.cancel(nil)
}

func (w *watchdog) unlinkLocked(tc *timedCall) {
	if !tc.listed {
		return
	}
	if tc.prev != nil {
		tc.prev.next = tc.next
	} else {
		w.head = tc.next
	}
	if tc.next != nil {
		tc.next.prev = tc.prev
	} else {
		w.tail = tc.prev
	}
	tc.prev, tc.next, tc.listed = nil, nil, false
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
			for w.head != nil {
				tc := w.head
				w.unlinkLocked(tc)
				tc.cancel(errClosedDuringCall)
			}
			w.mu.Unlock()
			return
		case <-t.C:
		}
		w.mu.Lock()
		now := w.tick.Add(1)
		// A call started at tick start has run more than now-start-1
		// ticks: cancel it once that reaches the timeout.
		for w.head != nil && now-w.head.start > ticksPerTimeout {
			tc := w.head
			w.unlinkLocked(tc)
			tc.cancel(errRequestTimeout)
		}
		w.mu.Unlock()
	}
}
