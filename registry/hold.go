package registry

import (
	"fmt"
	"time"

	"github.com/beaconplane/beacon/store"
)

// Riding out mass removals.
//
// Some removals are not the end of an instance but of its lease only, and
// its process writes it again moments later with the same ID:
//   - after a backend outage longer than the TTL, etcd expires every lease
//     at once when it comes back (its lessor counts the outage), and every
//     session re-registers within a keep-alive interval;
//   - an etcd leader stopped for longer than the TTL (SIGSTOP, a VM stall)
//     revokes, when it resumes, every lease it believes expired before it
//     notices it was replaced (etcd 3.7 skips its leadership check when its
//     ticker ran recently, and a resumed process's ticker runs at once);
//     every session re-registers within a keep-alive interval.
//
// Delivered as they happen, each is a removal and a re-add of the whole
// fleet for every watcher. The feed therefore holds back the removals that
// look like that — a serving instance removed shortly after the store came
// back from an outage, or in a burst (removals of serving instances of
// burstMin distinct leases within burstWindow: one process closing many
// registrations is one lease, and a fleet losing its leases is many; where
// a backend names no lease, distinct revisions count; etcd's lessor
// revokes the leases that expired since its last tick together, every
// 500 ms, so independent crashes a few hundred milliseconds apart arrive
// in twos and threes, one tick's worth at a time, while a fleet that loses
// its leases arrives as many more in one tick; the window is shorter than
// a tick so that two ticks never add up): if the same key is written again
// meanwhile, the removal is dropped (watchers see nothing, or an update if
// the value changed); otherwise it is delivered when its hold ends. Every
// other removal of a serving instance waits only holdCoalesce (50 ms) (to
// see whether a burst follows); removals of draining instances are
// delivered at once.
//
// How long each removal may be held is the removed instance's own: the
// time its registrant takes to notice a lost lease and write the instance
// again (registrantHold of the lease TTL its stored value declares), never
// more than that TTL + 1 s, counted from the removal. The watcher's own
// settings can only shorten it (Config.RemovalHold) — the watcher knows
// nothing of the registrants, and a dead instance must leave every
// consumer as soon as its registrant promised. An instance whose value
// declares no TTL (written by something other than Beacon) is not held.
//
// The cost: a consumer keeps an instance that really died in such a burst
// (a rack that lost power) for up to its hold longer.

const (
	holdCoalesce = 50 * time.Millisecond // every held-back serving removal waits this long
	burstWindow  = 250 * time.Millisecond
	burstMin     = 5
)

// registrantHold is how long a watcher may hold back the removal of an
// instance kept alive on a lease of ttl: what a session with that TTL
// takes to notice the loss and write the instance again — a keep-alive
// interval, one store call of its recovery lost to a hung server
// (workTimeoutFor) and 1 s — and at most ttl + 1 s. 0 for an unknown TTL.
func registrantHold(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		return 0
	}
	return min(keepAliveInterval(ttl)+workTimeoutFor(ttl)+time.Second, ttl+time.Second)
}

// recentRemoval is a removal of a serving instance, for burst detection.
type recentRemoval struct {
	at  time.Time
	who burstID
}

// burstID is what a burst counts distinct of: the removed key's lease, or,
// for a key without one, the removal's revision (or a listing's unique
// stand-in for it).
type burstID struct {
	lease store.LeaseID
	rev   int64
}

// pendingRemoval is a removal not delivered yet; its item stays in the tree.
type pendingRemoval struct {
	it    *item
	at    time.Time     // when the removal was seen
	hold  time.Duration // the longest it may be held (holdOf)
	until time.Time
	held  bool // held for its whole hold (not just coalescing)
}

// holds decides when the removals of one feed are delivered. It is
// bookkeeping only: every call is given the time (the feed's clock, or a
// test's), and the feed's mu guards it. An item whose removal is pending
// stays in the feed's view until it is due.
type holds struct {
	limit   time.Duration // Config.RemovalHold: negative none, 0 no limit, positive the most
	pending map[string]*pendingRemoval
	recent  []recentRemoval // recent removals of serving instances (bursts)
	backAt  time.Time       // when the store last came back from an outage
	logged  time.Time       // until when a hold episode was logged
	listed  int64           // burst IDs handed to re-listed removals (listingID)
}

// listingID returns a burst ID for a removal found by a re-listing, unlike
// any other: each such removal happened at a revision of its own, unknown
// here, and counts apart towards a burst (negative: never a revision).
func (h *holds) listingID() int64 {
	h.listed++
	return -h.listed
}

func newHolds(limit time.Duration) *holds {
	return &holds{limit: limit, pending: make(map[string]*pendingRemoval)}
}

// holdOf returns how long the removal of it may be held back: what its
// registrant's lease TTL allows, within the watcher's limit. 0 (delivered
// at once) for a draining instance, an instance whose value declares no
// TTL, and with a negative limit.
func (h *holds) holdOf(it *item) time.Duration {
	if h.limit < 0 || !it.Inst.Serving() {
		return 0
	}
	d := registrantHold(it.TTL)
	if h.limit > 0 {
		d = min(d, h.limit)
	}
	return d
}

// episode describes the start of a hold episode, for the log.
type episode struct {
	why     string
	longest time.Duration
}

// remove notes the removal of it at now, counted towards a burst as who.
// It reports whether the removal is pending (delivered by due, or dropped
// by rewritten); otherwise the caller delivers it at once. ep is set when
// a new hold episode starts.
func (h *holds) remove(it *item, who burstID, now time.Time) (pending bool, ep *episode) {
	hold := h.holdOf(it)
	if it.Inst.Serving() {
		h.noteRecent(who, now)
	}
	if hold <= 0 {
		delete(h.pending, it.Key)
		return false, nil
	}
	if h.pending[it.Key] != nil {
		return true, nil // already on its way out
	}
	h.pending[it.Key] = &pendingRemoval{it: it, at: now, hold: hold, until: now.Add(min(holdCoalesce, hold))}
	burst := h.burst()
	afterOutage := !h.backAt.IsZero() && now.Sub(h.backAt) < hold
	if !burst && !afterOutage {
		return true, nil
	}
	n, longest := 0, time.Duration(0)
	for _, q := range h.pending {
		if !q.held {
			q.held, q.until, n = true, q.at.Add(q.hold), n+1
			longest = max(longest, q.hold)
		}
	}
	if n == 0 || !now.After(h.logged) {
		return true, nil
	}
	h.logged = now.Add(longest) // one line per episode
	ep = &episode{why: "a burst of removals", longest: longest}
	if afterOutage {
		ep.why = "removals just after the store came back"
	}
	return true, ep
}

// noteRecent records a removal of a serving instance at now and drops
// those older than the burst window.
func (h *holds) noteRecent(who burstID, now time.Time) {
	keep := h.recent[:0]
	for _, r := range h.recent {
		if now.Sub(r.at) < burstWindow {
			keep = append(keep, r)
		}
	}
	h.recent = append(keep, recentRemoval{at: now, who: who})
}

// burst reports whether the recent removals are of burstMin distinct
// leases (or revisions).
func (h *holds) burst() bool {
	seen := make(map[burstID]bool, len(h.recent))
	for _, r := range h.recent {
		seen[r.who] = true
	}
	return len(seen) >= burstMin
}

// rewritten drops a pending removal of key (it was written again). It
// reports whether the removal had been held (not just coalescing).
func (h *holds) rewritten(key string) (wasHeld bool) {
	p := h.pending[key]
	if p == nil {
		return false
	}
	delete(h.pending, key)
	return p.held
}

// replaced notes that the item of a pending removal was replaced by next
// (its health changed): the removal, when due, delivers next.
func (h *holds) replaced(old, next *item) {
	if p := h.pending[old.Key]; p != nil && p.it == old {
		p.it = next
	}
}

// cameBack notes that the store came back from an outage at now.
func (h *holds) cameBack(now time.Time) { h.backAt = now }

// due removes and returns the pending removals due at now, and how long
// until the next one is (negative: none is pending).
func (h *holds) due(now time.Time) (ready []*pendingRemoval, next time.Duration) {
	next = -1
	for key, p := range h.pending {
		if wait := p.until.Sub(now); wait > 0 {
			if next < 0 || wait < next {
				next = wait
			}
			continue
		}
		delete(h.pending, key)
		ready = append(ready, p)
	}
	return ready, next
}

// removeLocked removes the instance old, seen at revision rev: at once,
// or later (see above). Removals found by a re-listing all carry the
// listing's revision, though they happened at revisions of their own:
// they pass a distinct burst key each (listingID; events pass their
// revision), so that several of them count as a burst.
func (f *feed) removeLocked(old *item, rev, burstKey int64, now time.Time) {
	who := burstID{rev: burstKey}
	if old.Lease != store.NoLease {
		who = burstID{lease: old.Lease}
	}
	pending, ep := f.holds.remove(old, who, now)
	if ep != nil {
		f.h.r.log.Info("holding removals for re-registrations (mass lease expiry or revocation?)",
			"prefix", f.prefix, "why", ep.why, "longest_hold", ep.longest)
	}
	if pending {
		f.wakeExpiry()
		return
	}
	f.deleteLocked(old, rev)
}

// rewrittenLocked notes that key was written: a pending removal of it is
// dropped.
func (f *feed) rewrittenLocked(key string) {
	if f.holds.rewritten(key) {
		f.h.r.m.heldRemoval("cancelled")
	}
}

// wakeExpiry pokes the expiry goroutine (a new deadline).
func (f *feed) wakeExpiry() {
	select {
	case f.holdWake <- struct{}{}:
	default:
	}
}

// expire delivers pending removals when they are due, until the feed
// stops. One per feed.
func (f *feed) expire() {
	defer f.h.r.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next := f.deliverDue(time.Now())
		if next < 0 {
			next = time.Hour
		}
		t.Reset(next)
		select {
		case <-f.ctx.Done():
			return
		case <-f.holdWake:
		case <-t.C:
		}
	}
}

// deliverDue delivers the removals due at now and returns how long until
// the next one is (negative: none is pending). A removal whose item was
// replaced meanwhile is dropped.
func (f *feed) deliverDue(now time.Time) time.Duration {
	f.mu.Lock()
	defer f.unlock()
	ready, next := f.holds.due(now)
	delivered := 0
	for _, p := range ready {
		// Logged at the current revision; if a batch was given at it
		// already, a watcher resuming from it must get it too (Deliver).
		if f.view.Deliver(p.it) {
			f.health.Count(p.it.Key, &p.it.Inst, nil)
			delivered++
			if p.held {
				f.h.r.m.heldRemoval("delivered")
			}
		}
	}
	if delivered > 0 {
		f.settleLocked(f.view.Rev(), true)
		f.view.Trim()
		f.wake.Notify()
	}
	return next
}

// String describes a pending removal (for logs and tests).
func (p *pendingRemoval) String() string {
	return fmt.Sprintf("%s until %s (held %v)", p.it.Key, p.until.Format(time.RFC3339Nano), p.held)
}
