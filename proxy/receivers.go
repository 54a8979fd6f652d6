package proxy

import (
	"sync"
	"sync/atomic"
)

// The receivers of an upstream watch, by client stream.
//
// dispatch hands every upstream response to every receiver, so the
// receivers are kept the way it walks them: one dense list per client
// stream (nil: the internal consumers), each entry holding what dispatch
// reads and writes for an event (the watcher's next revision, its ID and
// filters), so that a response to 100,000 watchers reads memory in order
// instead of visiting 100,000 watchers, and each stream gets its share as
// one list (fanItem) rather than one queued item per watcher. A map of
// watchers and a queued item per watcher cost 0.6 µs per delivered event
// at 100,000 watchers (issue 26; docs/proxy.md).

// recvEntry is one receiver of an upstream.
type recvEntry struct {
	nextrev int64 // the first revision w still needs
	id      int64 // w.id
	variant int   // w.variant
	w       *cwatcher
}

// receivers is an upstream's receivers; guarded by upstream.mu. A
// watcher's place in its stream's list is w.slot. Each list has a
// version, new (from listVersions) whenever its watchers change, so that
// two batches queued with the same version are for the same watchers in
// the same order: never two states of a list that happen to look alike.
type receivers struct {
	lists map[*cstream][]recvEntry
	vers  map[*cstream]uint64
	n     int
}

// listVersions numbers the versions of every upstream's lists.
var listVersions atomic.Uint64

func newReceivers() receivers {
	return receivers{lists: map[*cstream][]recvEntry{}, vers: map[*cstream]uint64{}}
}

// add makes w a receiver from revision next.
func (r *receivers) add(w *cwatcher, next int64) {
	l := r.lists[w.s]
	w.slot = len(l)
	r.lists[w.s] = append(l, recvEntry{nextrev: next, id: w.id, variant: w.variant, w: w})
	r.vers[w.s] = listVersions.Add(1)
	r.n++
}

// has reports whether w is a receiver.
func (r *receivers) has(w *cwatcher) bool {
	l := r.lists[w.s]
	return w.slot < len(l) && l[w.slot].w == w
}

// remove drops w; it reports whether w was a receiver. The last entry of
// w's list takes its place.
func (r *receivers) remove(w *cwatcher) bool {
	if !r.has(w) {
		return false
	}
	l := r.lists[w.s]
	last := len(l) - 1
	if w.slot != last {
		l[w.slot] = l[last]
		l[w.slot].w.slot = w.slot
	}
	l[last] = recvEntry{}
	if last == 0 {
		delete(r.lists, w.s)
		delete(r.vers, w.s)
	} else {
		r.lists[w.s] = l[:last]
		r.vers[w.s] = listVersions.Add(1)
	}
	r.n--
	return true
}

// nextrev is the first revision receiver w still needs.
func (r *receivers) nextrev(w *cwatcher) int64 {
	return r.lists[w.s][w.slot].nextrev
}

// takeAll empties r and returns what it held.
func (r *receivers) takeAll() []recvEntry {
	var all []recvEntry
	for _, l := range r.lists {
		all = append(all, l...)
	}
	*r = newReceivers()
	return all
}

// each calls f with every receiver (f may change its entry, not r).
func (r *receivers) each(f func(e *recvEntry)) {
	for _, l := range r.lists {
		for i := range l {
			f(&l[i])
		}
	}
}

// fanItem is one watcher's share of a batch: its events from revision
// from. It holds what the stream's sender needs, so that the sender does
// not visit the watcher.
type fanItem struct {
	from    int64
	id      int64
	variant int
}

// fanLists keeps the lists that streams' senders are done with.
var fanLists = sync.Pool{New: func() any { return new([]fanItem) }}

// fanOut hands batch b to every receiver that still needs some of it: the
// internal consumers one by one, each client stream its watchers' share
// as one list, with the list's version when every watcher of it takes
// part (0 when some had it all already: a share of a list merges with
// nothing). u.mu is held, so that batches reach each stream in order.
func (u *upstream) fanOut(b *evBatch) {
	for s, l := range u.recv.lists {
		if s == nil {
			for i := range l {
				if e := &l[i]; e.nextrev <= b.last {
					from := e.nextrev
					e.nextrev = b.last + 1
					e.w.sink.apply(b, from)
				}
			}
			continue
		}
		fan := (*fanLists.Get().(*[]fanItem))[:0]
		for i := range l {
			if e := &l[i]; e.nextrev <= b.last {
				fan = append(fan, fanItem{from: e.nextrev, id: e.id, variant: e.variant})
				e.nextrev = b.last + 1
			}
		}
		if len(fan) == 0 {
			putFan(fan)
			continue
		}
		var ver uint64
		if len(fan) == len(l) {
			ver = u.recv.vers[s]
		}
		s.enqueueEvents(b, fan, ver)
	}
}

// putFan gives a list back for reuse once its stream has sent it.
func putFan(fan []fanItem) {
	fan = fan[:0]
	fanLists.Put(&fan)
}
