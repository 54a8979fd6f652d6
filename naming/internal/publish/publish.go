// Package publish holds what Beacon's gRPC name resolvers share: turning a
// list of entries into a resolver.State (full state, every time), the
// error reporting that keeps a channel from going silently stale, retry
// backoff, and metrics.
package publish

import (
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"
)

// Entry is one endpoint to publish, as a View builds it.
type Entry struct {
	// Key identifies the entry (a store key); it orders entries and names
	// them in logs. View sets it.
	Key string
	// Addr is the address to dial: host:port.
	Addr string
	// Attrs are set as the Endpoint's Attributes and as the Address's
	// BalancerAttributes. Every value must be comparable or implement
	// Equal(any) bool.
	Attrs *attributes.Attributes

	undialable bool // set by View
}

func (e Entry) equal(o Entry) bool {
	return e.Key == o.Key && e.Addr == o.Addr && e.Attrs.Equal(o.Attrs)
}

// Publisher pushes states to one gRPC ClientConn. It is used by one
// goroutine.
type Publisher struct {
	cc     resolver.ClientConn
	scheme string
	target string
	m      *Metrics
	log    *slog.Logger

	published bool    // a state was pushed
	errored   bool    // an error was reported after it
	last      []Entry // what was pushed
	lastEmpty string  // the error reported with an empty state
	skips     map[skip]bool
	seen      map[string]bool // scratch: addresses of one Publish
}

type skip struct{ key, addr, reason string }

// New returns a Publisher for cc. target names the channel's target in logs.
func New(cc resolver.ClientConn, scheme, target string, m *Metrics, log *slog.Logger) *Publisher {
	return &Publisher{cc: cc, scheme: scheme, target: target, m: m, log: log, skips: map[skip]bool{}, seen: map[string]bool{}}
}

// Publish pushes entries (from View.Entries), in the order given, as the
// complete state: one
// Endpoint with one Address per entry. Entries whose address gRPC cannot
// dial (not host:port) and entries repeating an earlier entry's address are
// left out, logged once and counted. If nothing is left, Publish reports
// empty as the error, so that RPCs fail fast with it instead of waiting,
// after pushing an empty state if the last state had endpoints (so that
// balancers drop their connections).
// A state equal to the last one pushed (with the same error, if empty),
// with no error reported since, is not pushed again.
func (p *Publisher) Publish(entries []Entry, empty error) {
	kept := make([]Entry, 0, len(entries))
	seen := p.seen
	clear(seen)
	var skips map[skip]bool
	for _, e := range entries {
		reason := ""
		switch {
		case e.undialable:
			reason = ReasonNotDialable
		case seen[e.Addr]:
			reason = ReasonDuplicate
		}
		if reason != "" {
			s := skip{e.Key, e.Addr, reason}
			if skips == nil {
				skips = make(map[skip]bool)
			}
			skips[s] = true
			if !p.skips[s] {
				p.m.Skipped(p.scheme, reason)
				p.log.Warn("endpoint left out of the resolver state", "target", p.target,
					"key", e.Key, "addr", e.Addr, "reason", reason)
			}
			continue
		}
		seen[e.Addr] = true
		kept = append(kept, e)
	}
	p.skips = skips
	emptyMsg := ""
	if len(kept) == 0 && empty != nil {
		emptyMsg = empty.Error()
	}
	if p.published && !p.errored && slices.EqualFunc(kept, p.last, Entry.equal) && emptyMsg == p.lastEmpty {
		return
	}
	hadEndpoints := len(p.last) > 0
	p.published, p.errored, p.last, p.lastEmpty = true, false, kept, emptyMsg
	if len(kept) == 0 {
		if hadEndpoints {
			// Make the balancer drop its connections. (Until the error
			// below arrives, pick_first fails RPCs with its own
			// "produced zero addresses".)
			p.m.Update(p.scheme)
			_ = p.cc.UpdateState(resolver.State{Endpoints: []resolver.Endpoint{}})
		}
		p.m.Error(p.scheme, ReasonNoInstances)
		p.log.Debug("no endpoints; RPCs fail fast until one appears", "target", p.target, "err", empty)
		p.cc.ReportError(empty)
		return
	}
	p.m.Update(p.scheme)
	state := resolver.State{
		Endpoints: make([]resolver.Endpoint, len(kept)),
		Addresses: make([]resolver.Address, len(kept)),
	}
	epAddrs := make([]resolver.Address, len(kept)) // one allocation for every endpoint's address
	for i, e := range kept {
		// The legacy address list, for balancers that read addresses, carries
		// the attributes too (these addresses are not inside an endpoint).
		state.Addresses[i] = resolver.Address{Addr: e.Addr, BalancerAttributes: e.Attrs} //nolint:staticcheck // see above
		epAddrs[i] = resolver.Address{Addr: e.Addr}
		state.Endpoints[i] = resolver.Endpoint{Addresses: epAddrs[i : i+1 : i+1], Attributes: e.Attrs}
	}
	if err := p.cc.UpdateState(state); err != nil {
		// A watch-driven resolver has nothing to re-resolve: the next
		// change pushes a new state.
		p.log.Debug("gRPC did not accept the resolver state", "target", p.target, "err", err)
	}
	p.log.Debug("resolver state pushed", "target", p.target, "endpoints", len(kept))
}

// Error reports err to gRPC and counts it under reason. The next Publish
// pushes its state even if it did not change.
func (p *Publisher) Error(reason string, err error) {
	p.errored = true
	p.m.Error(p.scheme, reason)
	p.cc.ReportError(err)
}

// Dialable reports whether gRPC can dial addr as is: host:port with a
// non-empty host and a port in 1-65535.
func Dialable(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}

// Backoff is capped exponential backoff with jitter.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next returns the next delay: Min, then doubling up to Max, each with up
// to 20% of jitter subtracted.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(2*b.cur, b.Max)
	}
	jitter := time.Duration(rand.Int64N(int64(b.cur)/5 + 1))
	return b.cur - jitter
}

// Reset starts over at Min.
func (b *Backoff) Reset() { b.cur = 0 }
