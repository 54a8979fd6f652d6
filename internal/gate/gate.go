// Package gate holds a goroutine where it is until released: how the
// drills and tests play a consumer that stops reading or a client that
// stalls, so that what comes meanwhile queues up behind it.
package gate

import (
	"context"
	"sync"
)

// Gate is open until Hold, and open again after Release. The zero value
// is an open gate; it is safe for concurrent use.
type Gate struct {
	mu sync.Mutex
	ch chan struct{} // nil while open; closed by Release
}

// Hold closes the gate: the next Waits block until Release. Holding a
// held gate does nothing.
func (g *Gate) Hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
}

// Release opens the gate and lets every waiter through. Releasing an
// open gate does nothing.
func (g *Gate) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}

// Wait returns at once while the gate is open; while it is held, when it
// is released (nil) or ctx is done (ctx.Err()).
func (g *Gate) Wait(ctx context.Context) error {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
