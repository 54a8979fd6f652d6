package view

import (
	"context"
	"sync"
)

// Life is one watcher's lifetime, the same in both registries: it ends
// once, by End (the watcher's Close) or when the context it began with is
// done, whichever comes first, and then runs its release func.
type Life struct {
	done    chan struct{}
	ctxDone <-chan struct{} // the Done of the context it began with
	once    sync.Once
	stop    func() bool // stops watching the context
	release func()
}

// Begin starts a Life that ends when ctx is done or End is called;
// release runs once, when it ends.
func Begin(ctx context.Context, release func()) *Life {
	l := &Life{done: make(chan struct{}), ctxDone: ctx.Done(), release: release}
	// The callback must not read l.stop: it is written after AfterFunc
	// returns, with no ordering against the callback.
	l.stop = context.AfterFunc(ctx, l.end)
	return l
}

// Done is closed when the Life has ended.
func (l *Life) Done() <-chan struct{} { return l.done }

// End ends the Life now (a no-op once ended).
func (l *Life) End() {
	l.stop()
	l.end()
}

func (l *Life) end() {
	l.once.Do(func() {
		close(l.done)
		l.release()
	})
}
