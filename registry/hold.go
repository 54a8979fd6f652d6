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
// look like that — a serving instance removed less than RemovalHold after
// the store came back from an outage, or in a burst (removals of serving
// instances of burstMin distinct leases within burstWindow: one process
// closing many registrations is one lease, and a fleet losing its leases
// is many; where a backend names no lease, distinct revisions count; etcd's
// lessor revokes the leases that expired since its last tick together,
// every 500 ms, so independent crashes a few hundred milliseconds apart
// arrive in twos and threes, one tick's worth at a time, while a fleet
// that loses its leases arrives as many more in one tick; the window is
// shorter than a tick so that two ticks never add up) — for up to
// RemovalHold: if the same key is written again meanwhile, the removal is
// dropped (watchers see nothing, or an update if the value changed);
// otherwise it is delivered when the hold ends. Every other removal of a
// serving instance waits only holdCoalesce (50 ms) (to see whether a burst
// follows); removals of draining instances are delivered at once.
//
// The cost: a consumer keeps an instance that really died in such a burst
// (a rack that lost power) for up to RemovalHold longer.

const (
	holdCoalesce = 50 * time.Millisecond // every serving removal waits this long
	burstWindow  = 250 * time.Millisecond
	burstMin     = 5
)

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
	until time.Time
	held  bool // held for the whole hold (not just coalescing)
}

// holdFor returns how long removals are held (0: never).
func (f *feed) holdFor() time.Duration { return max(f.h.r.cfg.RemovalHold, 0) }

// removeLocked removes the instance at old.key, seen at revision rev:
// at once, or later (see above). Removals found by a re-listing all carry
// the listing's revision, though they happened at revisions of their own:
// they pass a distinct burst key each (events pass their revision), so
// that several of them count as a burst.
func (f *feed) removeLocked(old *item, rev, burstKey int64, now time.Time) {
	hold := f.holdFor()
	if hold <= 0 || !old.inst.Serving() {
		if p := f.pending[old.key]; p != nil {
			delete(f.pending, old.key)
		}
		f.tree.Delete(old)
		f.appendLocked(change{rev: rev, key: old.key, before: old})
		return
	}
	if f.pending[old.key] != nil {
		return // already on its way out
	}
	p := &pendingRemoval{it: old, until: now.Add(holdCoalesce)}
	f.pending[old.key] = p
	// A burst: count the leases (or revisions) of recent serving removals,
	// this one included.
	who := burstID{rev: burstKey}
	if old.lease != store.NoLease {
		who = burstID{lease: old.lease}
	}
	keep := f.recent[:0]
	seen := map[burstID]bool{who: true}
	for _, r := range f.recent {
		if now.Sub(r.at) < burstWindow {
			keep = append(keep, r)
			seen[r.who] = true
		}
	}
	f.recent = append(keep, recentRemoval{at: now, who: who})
	burst := len(seen) >= burstMin
	afterOutage := !f.backAt.IsZero() && now.Sub(f.backAt) < hold
	if burst || afterOutage {
		n := 0
		for _, q := range f.pending {
			if !q.held {
				q.held, q.until, n = true, now.Add(hold), n+1
			}
		}
		if n > 0 && now.After(f.holdLogged) {
			// One line per episode.
			f.holdLogged = now.Add(hold)
			why := "a burst of removals"
			if afterOutage {
				why = "removals just after the store came back"
			}
			f.h.r.log.Info("holding removals for re-registrations (mass lease expiry or revocation?)",
				"prefix", f.prefix, "why", why, "hold", hold)
		}
	}
	f.wakeExpiry()
}

// rewrittenLocked notes that key was written: a pending removal of it is
// dropped.
func (f *feed) rewrittenLocked(key string) {
	if p := f.pending[key]; p != nil {
		delete(f.pending, key)
		if p.held {
			f.h.r.m.heldRemoval("cancelled")
		}
	}
}

// reportedLocked records that a batch is given at rev.
func (f *feed) reportedLocked(rev int64) { f.reported = max(f.reported, rev) }

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
		f.mu.Lock()
		now := time.Now()
		next := time.Duration(-1)
		delivered := 0
		for key, p := range f.pending {
			if wait := p.until.Sub(now); wait > 0 {
				if next < 0 || wait < next {
					next = wait
				}
				continue
			}
			delete(f.pending, key)
			if cur, ok := f.tree.Get(p.it); ok && cur == p.it {
				f.tree.Delete(p.it)
				// Logged at the current revision; if a batch was given at
				// it already, a watcher resuming from it must get it too.
				f.appendLocked(change{rev: f.rev, key: key, before: p.it, late: f.reported >= f.rev})
				delivered++
				if p.held {
					f.h.r.m.heldRemoval("delivered")
				}
			}
		}
		if delivered > 0 {
			f.seqDirtyLocked()
		}
		f.mu.Unlock()
		if next < 0 {
			next = time.Hour
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
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

// seqDirtyLocked publishes removals delivered outside a store event.
func (f *feed) seqDirtyLocked() {
	f.trimLocked()
	f.notifyLocked()
}

// String describes a pending removal (for logs and tests).
func (p *pendingRemoval) String() string {
	return fmt.Sprintf("%s until %s (held %v)", p.it.key, p.until.Format(time.RFC3339Nano), p.held)
}
