package registry

import (
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
)

// metricLeased counts the instances a registry registered on leases of
// their own (RegisterWithTTL, RegisterLeased: the HTTP API's
// registrations), as beacon_registry_registrations counts the session's.
const metricLeased = "beacon_registry_leased_registrations"

// leasedTracker knows the instances a registry registered on caller-owned
// leases, or renewed through it (a heartbeat after a restart, or through
// another server than the one that registered), and until when each lease
// is alive: the TTL from its grant or its last renewal through this
// registry. An instance stops counting when it
// is deregistered, its lease revoked or found ended, or its deadline
// passes without a renewal through this registry (its client stopped
// heartbeating: the store deletes it then too).
type leasedTracker struct {
	fallbackTTL time.Duration // for a lease granted elsewhere, until renewed here
	mu          sync.Mutex
	leases      map[store.LeaseID]*leasedEntry
	byRef       map[beacon.Ref]store.LeaseID
}

type leasedEntry struct {
	ttl      time.Duration
	deadline time.Time
	refs     map[beacon.Ref]struct{}
}

func newLeasedTracker(fallbackTTL time.Duration) *leasedTracker {
	return &leasedTracker{fallbackTTL: fallbackTTL, leases: map[store.LeaseID]*leasedEntry{}, byRef: map[beacon.Ref]store.LeaseID{}}
}

func (t *leasedTracker) entry(id store.LeaseID) *leasedEntry {
	e := t.leases[id]
	if e == nil {
		e = &leasedEntry{ttl: t.fallbackTTL, deadline: time.Now().Add(t.fallbackTTL), refs: map[beacon.Ref]struct{}{}}
		t.leases[id] = e
	}
	return e
}

func (t *leasedTracker) granted(id store.LeaseID, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	e.ttl, e.deadline = ttl, time.Now().Add(ttl)
}

func (t *leasedTracker) registered(id store.LeaseID, ref beacon.Ref) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entry(id).refs[ref] = struct{}{}
	t.byRef[ref] = id
}

// ttl returns the TTL of the lease of the instance at ref as far as the
// registry knows (its grant or last renewal here), else the fallback.
func (t *leasedTracker) ttl(ref beacon.Ref) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.leases[t.byRef[ref]]; e != nil && e.ttl > 0 {
		return e.ttl
	}
	return t.fallbackTTL
}

// leaseTTL returns the TTL of lease id as granted or last renewed through
// this registry, or 0 if it does not know the lease.
func (t *leasedTracker) leaseTTL(id store.LeaseID) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.leases[id]; e != nil {
		return e.ttl
	}
	return 0
}

// forgetLocked drops lease id and its instances.
func (t *leasedTracker) forgetLocked(id store.LeaseID) {
	if e := t.leases[id]; e != nil {
		for ref := range e.refs {
			if t.byRef[ref] == id {
				delete(t.byRef, ref)
			}
		}
	}
	delete(t.leases, id)
}

func (t *leasedTracker) renewed(id store.LeaseID, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.leases[id]; e != nil {
		e.ttl, e.deadline = ttl, time.Now().Add(ttl)
	}
}

// heartbeat records a renewal through this registry of ref's lease, which
// may have been granted elsewhere (by the process before a restart, or by
// another server): the instance counts from now on.
func (t *leasedTracker) heartbeat(id store.LeaseID, ref beacon.Ref, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	e.ttl, e.deadline = ttl, time.Now().Add(ttl)
	e.refs[ref] = struct{}{}
}

func (t *leasedTracker) deregistered(id store.LeaseID, ref beacon.Ref) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.leases[id]; e != nil {
		delete(e.refs, ref)
	}
	if t.byRef[ref] == id {
		delete(t.byRef, ref)
	}
}

func (t *leasedTracker) ended(id store.LeaseID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(id)
}

// live counts the instances whose lease is alive as far as the registry
// knows, forgetting the leases whose deadline has passed.
func (t *leasedTracker) live(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for id, e := range t.leases {
		if now.After(e.deadline) {
			t.forgetLocked(id)
			continue
		}
		n += len(e.refs)
	}
	return n
}

// leasedCollector exports beacon_registry_leased_registrations: the sum
// over the registries sharing a Registerer, computed when scraped.
type leasedCollector struct {
	desc    *prometheus.Desc
	mu      sync.Mutex
	sources map[*leasedTracker]struct{}
}

func newLeasedCollector() *leasedCollector {
	return &leasedCollector{
		desc: prometheus.NewDesc(metricLeased,
			"Instances registered, or heartbeated, through this process on leases of their own (the HTTP API's registrations) whose lease is alive as far as the process knows: not deregistered, revoked or expired without a heartbeat through it.",
			nil, nil),
		sources: map[*leasedTracker]struct{}{},
	}
}

func (c *leasedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *leasedCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := make([]*leasedTracker, 0, len(c.sources))
	for t := range c.sources {
		sources = append(sources, t)
	}
	c.mu.Unlock()
	n, now := 0, time.Now()
	for _, t := range sources {
		n += t.live(now)
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n))
}

func (c *leasedCollector) add(t *leasedTracker) {
	c.mu.Lock()
	c.sources[t] = struct{}{}
	c.mu.Unlock()
}

func (c *leasedCollector) remove(t *leasedTracker) {
	c.mu.Lock()
	delete(c.sources, t)
	c.mu.Unlock()
}
