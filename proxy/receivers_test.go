package proxy

import (
	"math/rand/v2"
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
	for i := range 5000 {
		if len(held) > 0 && rnd.IntN(3) == 0 {
			for w := range held { // any one
				if !r.remove(w) {
					t.Fatalf("step %d: remove of a held watcher reported none", i)
				}
				delete(held, w)
				gone = append(gone, w)
				break
			}
		} else {
			w := &cwatcher{id: int64(i), s: streams[rnd.IntN(len(streams))]}
			next := rnd.Int64N(100)
			r.add(w, next)
			held[w] = next
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
// revision, one list per stream; one that has it all already gets
// nothing; every receiver then needs the revision after the batch.
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
	queued := func(s *cstream) []fanItem {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.queue) != 1 || s.queue[0].b != b {
			t.Fatalf("stream queue %+v, want the batch once", s.queue)
		}
		return s.queue[0].fan
	}
	got1, got2 := queued(s1), queued(s2)
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

// TestSenderMergesOnlyTheSameWatchersInOrder: items for the same
// watchers in another order, or other filters, are not merged (each
// list's i-th entry must be the same watcher).
func TestSenderMergesOnlyTheSameWatchersInOrder(t *testing.T) {
	a := []fanItem{{id: 1}, {id: 2}}
	for _, c := range []struct {
		b    []fanItem
		same bool
	}{
		{[]fanItem{{id: 1, from: 7}, {id: 2, from: 9}}, true},
		{[]fanItem{{id: 2}, {id: 1}}, false},
		{[]fanItem{{id: 1}}, false},
		{[]fanItem{{id: 1}, {id: 2, variant: 2}}, false},
	} {
		if got := sameWatchers(a, c.b); got != c.same {
			t.Errorf("sameWatchers(%v, %v) = %v, want %v", a, c.b, got, c.same)
		}
	}
	batch := []qitem{{b: batchAt(1, 1), fan: a}, {b: batchAt(2, 1), fan: []fanItem{{id: 2}, {id: 1}}}}
	if end := mergeRun(batch, 0); end != 1 {
		t.Errorf("merge run of two lists in other orders ends at %d, want 1", end)
	}
}
