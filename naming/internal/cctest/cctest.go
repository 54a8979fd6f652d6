// Package cctest records what a name resolver tells gRPC: a
// resolver.ClientConn for unit tests of resolvers, where the test reads
// every UpdateState and ReportError in order. (End-to-end tests use real
// grpc.ClientConns.)
package cctest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/gate"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
)

// Timeout bounds every wait.
const Timeout = 10 * time.Second

// Event is one call from the resolver: a state, or an error.
type Event struct {
	State *resolver.State
	Err   error
}

func (e Event) String() string {
	if e.State != nil {
		return "state " + Addrs(*e.State)
	}
	return fmt.Sprintf("error %v", e.Err)
}

// ClientConn records calls. UpdateState and ReportError block while the
// ClientConn is held (Hold), as a busy gRPC channel could.
type ClientConn struct {
	mu     sync.Mutex
	events []Event
	wake   chan struct{}
	gate   gate.Gate
}

var _ resolver.ClientConn = (*ClientConn)(nil)

// New returns an empty recorder.
func New() *ClientConn { return &ClientConn{wake: make(chan struct{})} }

func (c *ClientConn) add(e Event) {
	_ = c.gate.Wait(context.Background()) // until Release
	c.mu.Lock()
	c.events = append(c.events, e)
	close(c.wake)
	c.wake = make(chan struct{})
	c.mu.Unlock()
}

// Hold makes the resolver's next calls block until Release.
func (c *ClientConn) Hold() { c.gate.Hold() }

// Release lets blocked calls through.
func (c *ClientConn) Release() { c.gate.Release() }

// UpdateState implements resolver.ClientConn.
func (c *ClientConn) UpdateState(s resolver.State) error {
	c.add(Event{State: &s})
	return nil
}

// ReportError implements resolver.ClientConn.
func (c *ClientConn) ReportError(err error) { c.add(Event{Err: err}) }

// NewAddress implements resolver.ClientConn (deprecated; never used).
func (c *ClientConn) NewAddress([]resolver.Address) { panic("cctest: NewAddress is deprecated") }

// ParseServiceConfig implements resolver.ClientConn.
func (c *ClientConn) ParseServiceConfig(string) *serviceconfig.ParseResult {
	return &serviceconfig.ParseResult{Err: fmt.Errorf("cctest: no service configs")}
}

// Events returns every call so far.
func (c *ClientConn) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Event(nil), c.events...)
}

// Wait returns the index and the first event at or after index from for
// which ok returns true, failing the test after Timeout.
func (c *ClientConn) Wait(tb testing.TB, from int, what string, ok func(Event) bool) (int, Event) {
	tb.Helper()
	deadline := time.After(Timeout)
	for {
		c.mu.Lock()
		events, wake := c.events, c.wake
		c.mu.Unlock()
		for i := from; i < len(events); i++ {
			if ok(events[i]) {
				return i, events[i]
			}
		}
		from = max(from, len(events))
		select {
		case <-wake:
		case <-deadline:
			tb.Fatalf("cctest: no %s after %v; events: %v", what, Timeout, c.Events())
			return 0, Event{}
		}
	}
}

// WaitState waits for a state whose addresses, as Addrs renders them, are
// want, and returns the index after it.
func (c *ClientConn) WaitState(tb testing.TB, from int, want string) (int, resolver.State) {
	tb.Helper()
	i, e := c.Wait(tb, from, "state "+want, func(e Event) bool { return e.State != nil && Addrs(*e.State) == want })
	return i + 1, *e.State
}

// WaitError waits for an error whose message contains substr, and returns
// the index after it.
func (c *ClientConn) WaitError(tb testing.TB, from int, substr string) (int, error) {
	tb.Helper()
	i, e := c.Wait(tb, from, "error containing "+substr, func(e Event) bool {
		return e.Err != nil && strings.Contains(e.Err.Error(), substr)
	})
	return i + 1, e.Err
}

// Addrs renders a state's endpoints as "[a b]" (first address of each, in
// order).
func Addrs(s resolver.State) string {
	parts := make([]string, 0, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		if len(ep.Addresses) > 0 {
			parts = append(parts, ep.Addresses[0].Addr)
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}
