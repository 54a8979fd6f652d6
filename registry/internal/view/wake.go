package view

import "context"

// Wake lets watchers wait for news: each takes C under its owner's lock,
// releases the lock and waits; Notify wakes every one of them. Fail ends
// them all for good. It has no lock: its owner's mutex guards it.
type Wake struct {
	ch  chan struct{}
	err error
}

// C returns the channel Notify closes next.
func (w *Wake) C() <-chan struct{} {
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// Notify wakes every watcher waiting on C. Once C was called, the next
// channel is made at once, so that C only reads and readers sharing a read
// lock may call it.
func (w *Wake) Notify() {
	if w.ch != nil {
		close(w.ch)
		w.ch = make(chan struct{})
	}
}

// Fail records a terminal error (the first one stays) and wakes every
// watcher.
func (w *Wake) Fail(err error) {
	if w.err == nil {
		w.err = err
		w.Notify()
	}
}

// Err returns the terminal error, if any.
func (w *Wake) Err() error { return w.err }

// Wait returns the next batch of a watcher: ask gives one (ok), or a
// channel to wait on before asking again (nil: ask again at once), or an
// error that ends the wait. It returns early when ctx is done (with
// ctx.Err()) or life has ended (with ended()).
//
// A ctx that is the one life began with (the same Done channel: a watcher
// that passes its Watch context to every Next, as most do) is not waited
// on apart: life ends with it, and its end then returns ctx.Err() all the
// same. Every waiting watcher thus waits on two channels, the feed's and
// its own, rather than also on one they all share (10,000 watchers
// waiting on one context: a tenth of their CPU went to locking its
// channel, BenchmarkWatchDelivery).
func Wait[B any](ctx context.Context, life *Life, ended func() error,
	ask func() (b B, ok bool, wake <-chan struct{}, err error)) (B, error) {
	var zero B
	done, ctxDone := life.Done(), ctx.Done()
	if ctxDone == life.ctxDone {
		ctxDone = nil // life.done closes when it does
	}
	for {
		select {
		case <-done:
			return zero, ended()
		default:
		}
		b, ok, wake, err := ask()
		switch {
		case err != nil:
			return zero, err
		case ok:
			return b, nil
		case wake == nil:
			continue
		}
		select {
		case <-wake:
		case <-ctxDone:
			return zero, ctx.Err()
		case <-done:
			if err := ctx.Err(); err != nil {
				return zero, err
			}
			return zero, ended()
		}
	}
}
