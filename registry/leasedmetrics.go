package registry

import (
	"crypto/sha256"
	"crypto/subtle"
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
//
// It also remembers, per lease, the proof of ownership a heartbeat
// checked (or the registration wrote): the ownership record never changes
// while its lease lives, so a later heartbeat presenting the same secret
// for the same instance needs only to find the instance still bound to
// the lease (Heartbeat's proven path).
//
// The leases whose deadline passed are forgotten when the metric is
// scraped and, at most once per sweepEvery, when a lease is recorded: a
// server whose clients crash and never come back holds no entry for them
// for long, scraped or not.
type leasedTracker struct {
	fallbackTTL time.Duration // for a lease granted elsewhere, until renewed here
	mu          sync.Mutex
	leases      map[store.LeaseID]*leasedEntry
	byRef       map[beacon.Ref]store.LeaseID
	swept       time.Time // the last sweep of passed deadlines
}

type leasedEntry struct {
	ttl      time.Duration
	deadline time.Time
	refs     map[beacon.Ref]struct{}
	// owner and proof: the instance the lease's ownership record names
	// and its secret's SHA-256, once checked (proven).
	owner  beacon.Ref
	proof  [sha256.Size]byte
	proven bool
}

// sweepEvery bounds how often recording a lease sweeps the tracker for
// leases whose deadline passed.
const sweepEvery = time.Minute

func newLeasedTracker(fallbackTTL time.Duration) *leasedTracker {
	return &leasedTracker{fallbackTTL: fallbackTTL, leases: map[store.LeaseID]*leasedEntry{}, byRef: map[beacon.Ref]store.LeaseID{},
		swept: time.Now()}
}

// entry returns lease id's entry, made if missing.
func (t *leasedTracker) entry(id store.LeaseID) *leasedEntry {
	e := t.leases[id]
	if e == nil {
		now := time.Now()
		if now.Sub(t.swept) >= sweepEvery {
			t.sweepLocked(now)
		}
		e = &leasedEntry{ttl: t.fallbackTTL, deadline: now.Add(t.fallbackTTL), refs: map[beacon.Ref]struct{}{}}
		t.leases[id] = e
	}
	return e
}

// sweepLocked forgets the leases whose deadline passed before now and
// returns how many instances the others hold.
func (t *leasedTracker) sweepLocked(now time.Time) int {
	t.swept = now
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

// prove records that the ownership record of lease id names ref and the
// secret whose hash is h.
func (t *leasedTracker) prove(id store.LeaseID, ref beacon.Ref, h [sha256.Size]byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	e.owner, e.proof, e.proven = ref, h, true
}

// proven returns the lease of the instance at ref if the secret whose
// hash is h was proven its owner's, and false if it was not (or is not
// known: a proof is checked against the store then). The comparison takes
// the same time whatever h is.
func (t *leasedTracker) proven(ref beacon.Ref, h [sha256.Size]byte) (store.LeaseID, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.byRef[ref]
	e := t.leases[id]
	if !ok || e == nil || !e.proven || e.owner != ref {
		return store.NoLease, false
	}
	if subtle.ConstantTimeCompare(h[:], e.proof[:]) != 1 {
		return store.NoLease, false
	}
	return id, true
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
// another server): the instance counts from now on, and its calls are
// bounded by its lease's TTL (ttl), not the fallback.
func (t *leasedTracker) heartbeat(id store.LeaseID, ref beacon.Ref, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	e.ttl, e.deadline = ttl, time.Now().Add(ttl)
	e.refs[ref] = struct{}{}
	t.byRef[ref] = id
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
	return t.sweepLocked(now)
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
