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
// error that ends the wait. It returns early when ctx is done or done is
// closed (then with ended()).
func Wait[B any](ctx context.Context, done <-chan struct{}, ended func() error,
	ask func() (b B, ok bool, wake <-chan struct{}, err error)) (B, error) {
	var zero B
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
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-done:
			return zero, ended()
		}
	}
}
