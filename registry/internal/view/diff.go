package view

import (
	"cmp"
	"slices"

	"github.com/beaconplane/beacon"
)

// The events a watcher gets are computed from versions, never pushed: a
// watcher holds the version it last delivered and, asking for more, gets
// the difference to the current one. match, if not nil, selects the items
// the watcher sees (an item it does not select counts as absent).

func event(t beacon.EventType, it *Item, rev int64) beacon.Event {
	return beacon.Event{Type: t, Instance: it.Inst.Clone(), Revision: rev}
}

func selects(match func(*Item) bool, it *Item) bool {
	return it != nil && (match == nil || match(it))
}

// Snapshot lists a version as Added events in key order, each at its
// item's revision.
func Snapshot(v *Version, match func(*Item) bool) []beacon.Event {
	out := make([]beacon.Event, 0, v.Len())
	v.Ascend(func(it *Item) bool {
		if selects(match, it) {
			out = append(out, event(beacon.Added, it, it.Rev))
		}
		return true
	})
	return out
}

// DiffLog turns the log entries between two versions into events: for
// each key, one event from its state in old to its state in cur, at the
// revision of its last entry.
func DiffLog(old, cur *Version, entries []Change, match func(*Item) bool) []beacon.Event {
	latest := make(map[string]int64, len(entries))
	for _, c := range entries {
		latest[c.Key] = c.Rev
	}
	out := make([]beacon.Event, 0, len(latest))
	for key, rev := range latest {
		probe := &Item{Key: key} // one allocation for both look-ups
		o, _ := old.tree.Get(probe)
		n, _ := cur.tree.Get(probe)
		if e, ok := transition(selected(match, o), selected(match, n), rev); ok {
			out = append(out, e)
		}
	}
	SortEvents(out)
	return out
}

func selected(match func(*Item) bool, it *Item) *Item {
	if !selects(match, it) {
		return nil
	}
	return it
}

// Resume turns the log entries after a revision into events for a
// consumer whose state is unknown but was the state at that revision: the
// first entry of each key says what it was then.
func Resume(entries []Change, cur *Version) []beacon.Event {
	type span struct {
		first *Item // state at the resume revision
		last  *Item // the state its latest change replaced
		rev   int64
	}
	spans := make(map[string]*span, len(entries))
	for _, c := range entries {
		s := spans[c.Key]
		if s == nil {
			s = &span{first: c.Before}
			spans[c.Key] = s
		}
		s.last = c.Before // the key's last entry, if absent at the end, is its removal
		s.rev = c.Rev
	}
	out := make([]beacon.Event, 0, len(spans))
	for key, s := range spans {
		n, _ := cur.Get(key)
		switch {
		case s.first == nil && n != nil:
			out = append(out, event(beacon.Added, n, s.rev))
		case s.first != nil && n == nil:
			out = append(out, event(beacon.Removed, s.last, s.rev))
		case s.first != nil && n != nil && !s.first.Inst.Equal(n.Inst):
			out = append(out, event(beacon.Updated, n, s.rev))
		}
	}
	SortEvents(out)
	return out
}

// DiffTrees compares two versions in full (a consumer so far behind that
// the log no longer covers its gap): removals carry cur's revision,
// additions and updates their item's.
func DiffTrees(old, cur *Version, match func(*Item) bool) []beacon.Event {
	var a, b []*Item
	old.Ascend(func(it *Item) bool {
		if selects(match, it) {
			a = append(a, it)
		}
		return true
	})
	cur.Ascend(func(it *Item) bool {
		if selects(match, it) {
			b = append(b, it)
		}
		return true
	})
	var out []beacon.Event
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].Key < b[j].Key):
			out = append(out, event(beacon.Removed, a[i], cur.Rev))
			i++
		case i == len(a) || b[j].Key < a[i].Key:
			out = append(out, event(beacon.Added, b[j], b[j].Rev))
			j++
		default:
			if e, ok := transition(a[i], b[j], b[j].Rev); ok {
				out = append(out, e)
			}
			i++
			j++
		}
	}
	SortEvents(out)
	return out
}

// transition is the event taking a consumer from o to n (nil: absent).
func transition(o, n *Item, rev int64) (beacon.Event, bool) {
	switch {
	case o == nil && n != nil:
		return event(beacon.Added, n, rev), true
	case o != nil && n == nil:
		return event(beacon.Removed, o, rev), true
	case o != nil && n != nil && !o.Inst.Equal(n.Inst):
		return event(beacon.Updated, n, rev), true
	}
	return beacon.Event{}, false
}

// SortEvents orders events by revision, then by instance.
func SortEvents(evs []beacon.Event) {
	slices.SortFunc(evs, func(a, b beacon.Event) int {
		if c := cmp.Compare(a.Revision, b.Revision); c != 0 {
			return c
		}
		return cmp.Compare(a.Instance.Ref().String(), b.Instance.Ref().String())
	})
}
