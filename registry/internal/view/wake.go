package view

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

// Notify wakes every watcher waiting on C.
func (w *Wake) Notify() {
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
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
