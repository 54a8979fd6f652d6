package proxy

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestReceiversKeepEveryWatchersPlace: through random adds and removes
// over several streams (and the internal consumers' nil stream), every
// receiver is found at its slot with the revision it was given, a removed
// one is gone (removing it again reports so), and the count is the
// number held; takeAll returns each exactly once and leaves none.
func TestReceiversKeepEveryWatchersPlace(t *testing.T) {
	rnd := rand.New(rand.NewPCG(26, 1))
	streams := []*cstream{nil, {}, {}, {}}
	r := newReceivers()
	held := map[*cwatcher]int64{}
	var gone []*cwatcher
	versions := map[uint64]bool{}
	newVersion := func(i int, s *cstream) { // of the list that changed
		if v, ok := r.vers[s]; ok && (versions[v] || v == 0) {
			t.Fatalf("step %d: the list that changed kept or reused version %d", i, v)
		} else if ok {
			versions[v] = true
		}
	}
	for i := range 5000 {
		if len(held) > 0 && rnd.IntN(3) == 0 {
			for w := range held { // any one
				if !r.remove(w) {
					t.Fatalf("step %d: remove of a held watcher reported none", i)
				}
				delete(held, w)
				gone = append(gone, w)
				newVersion(i, w.s)
				break
			}
		} else {
			w := &cwatcher{id: int64(i), s: streams[rnd.IntN(len(streams))]}
			next := rnd.Int64N(100)
			r.add(w, next)
			held[w] = next
			newVersion(i, w.s)
		}
		if r.n != len(held) {
			t.Fatalf("step %d: count %d, want %d", i, r.n, len(held))
		}
	}
	for w, next := range held {
		if !r.has(w) || r.nextrev(w) != next {
			t.Fatalf("watcher %d: held %v, nextrev %d, want %d", w.id, r.has(w), r.nextrev(w), next)
		}
		if e := r.lists[w.s][w.slot]; e.id != w.id || e.variant != w.variant {
			t.Fatalf("watcher %d: entry %+v", w.id, e)
		}
	}
	for _, w := range gone {
		if r.has(w) || r.remove(w) {
			t.Fatalf("watcher %d removed but still held", w.id)
		}
	}
	all := r.takeAll()
	seen := map[*cwatcher]bool{}
	for _, e := range all {
		if seen[e.w] || held[e.w] != e.nextrev {
			t.Fatalf("takeAll: watcher %d twice %v, nextrev %d want %d", e.id, seen[e.w], e.nextrev, held[e.w])
		}
		seen[e.w] = true
	}
	if len(all) != len(held) || r.n != 0 || len(r.lists) != 0 {
		t.Fatalf("takeAll returned %d of %d and left %d", len(all), len(held), r.n)
	}
}

// TestFanOutGivesEachStreamItsWatchersFromTheirRevision: a batch reaches
// every receiver that still needs some of it, each from its own next
// revision, one list per stream (with the list's version only when all of
// it takes part); one that has it all already gets nothing; every
// receiver then needs the revision after the batch.
func TestFanOutGivesEachStreamItsWatchersFromTheirRevision(t *testing.T) {
	r := newHubRig(t, 0)
	s1, s2 := r.bareStream(), r.bareStream()
	u := &upstream{hub: r.h, recv: newReceivers()}
	ws := []*cwatcher{{id: 1, s: s1}, {id: 2, s: s1, variant: 1}, {id: 3, s: s2}, {id: 4, s: s2}}
	for i, next := range []int64{3, 5, 4, 9} {
		u.recv.add(ws[i], next)
	}
	b := newBatch(nil, batchAt(5, 1).events)
	u.mu.Lock()
	u.fanOut(b)
	u.mu.Unlock()
	queued := func(s *cstream, ver uint64) []fanItem {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.queue) != 1 || s.queue[0].b != b || s.queue[0].ver != ver {
			t.Fatalf("stream queue %+v, want the batch once, list version %d", s.queue, ver)
		}
		return s.queue[0].fan
	}
	// Stream 1's whole list takes part (its version: merges with the
	// same); stream 2's only in share (version 0: merges with nothing).
	got1, got2 := queued(s1, u.recv.vers[s1]), queued(s2, 0)
	want1 := []fanItem{{from: 3, id: 1}, {from: 5, id: 2, variant: 1}}
	if len(got1) != 2 || got1[0] != want1[0] || got1[1] != want1[1] {
		t.Errorf("stream 1 got %+v, want %+v", got1, want1)
	}
	if len(got2) != 1 || got2[0] != (fanItem{from: 4, id: 3}) {
		t.Errorf("stream 2 got %+v, want only watcher 3 from 4", got2)
	}
	for i, want := range []int64{6, 6, 6, 9} {
		if got := u.recv.nextrev(ws[i]); got != want {
			t.Errorf("watcher %d nextrev %d, want %d", ws[i].id, got, want)
		}
	}
}

// TestSenderMergesOnlyTheSameListVersion: a share of a list (version 0:
// some of its watchers had the batch already) merges with nothing, and
// items of one version merge in order; the watcher gets every event in
// revision order.
func TestSenderMergesOnlyTheSameListVersion(t *testing.T) {
	s := newHubRig(t, 0).bareStream()
	one := func() []fanItem { return []fanItem{{id: 1, from: 1}} }
	for i, ver := range []uint64{10, 0, 0, 11, 11} {
		s.enqueueEvents(batchAt(int64(i+1), 1), one(), ver)
	}
	sendQueued(t, s)
	var sizes []int
	var revs []int64
	for _, resp := range s.ss.(*recStream).responses(1) {
		sizes = append(sizes, len(resp.Events))
		for _, ev := range resp.Events {
			revs = append(revs, ev.Kv.ModRevision)
		}
	}
	if !slices.Equal(sizes, []int{1, 1, 1, 2}) || !slices.Equal(revs, []int64{1, 2, 3, 4, 5}) {
		t.Fatalf("responses of %v events, revisions %v; want [1 1 1 2], [1 2 3 4 5]", sizes, revs)
	}
}
