package publish

import (
	"slices"
)

// View is a resolver's current set of entries, sorted by key and kept
// between publishes: an entry is built (attributes and all) only when its
// value changes, so a change to one endpoint of a large target costs little
// more than that endpoint. It is used by one goroutine.
type View[T any] struct {
	same  func(a, b T) bool
	entry func(key string, v T) (Entry, bool)
	m     map[string]*item[T]
	keys  []string // sorted unless unsorted
	// unsorted is set by Reset: a snapshot's keys are appended and sorted
	// once, at the next Entries.
	unsorted bool
}

type item[T any] struct {
	v       T
	e       Entry
	include bool
}

// NewView returns an empty view. same tells whether two values are equal
// (an equal Set changes nothing); entry builds the Entry of a value and says
// whether to include it in states (a draining instance is kept in the view
// but not published).
func NewView[T any](same func(a, b T) bool, entry func(key string, v T) (Entry, bool)) *View[T] {
	return &View[T]{same: same, entry: entry, m: make(map[string]*item[T])}
}

// Reset empties the view.
func (v *View[T]) Reset() {
	clear(v.m)
	v.keys = v.keys[:0]
	v.unsorted = true
}

// Set sets key to val.
func (v *View[T]) Set(key string, val T) {
	if it, ok := v.m[key]; ok {
		if !v.same(it.v, val) {
			it.v = val
			it.e, it.include = v.build(key, val)
		}
		return
	}
	it := &item[T]{v: val}
	it.e, it.include = v.build(key, val)
	v.m[key] = it
	if v.unsorted {
		v.keys = append(v.keys, key)
		return
	}
	i, _ := slices.BinarySearch(v.keys, key)
	v.keys = slices.Insert(v.keys, i, key)
}

func (v *View[T]) build(key string, val T) (Entry, bool) {
	e, include := v.entry(key, val)
	e.Key = key
	e.undialable = !Dialable(e.Addr)
	return e, include
}

// Delete removes key.
func (v *View[T]) Delete(key string) {
	if _, ok := v.m[key]; !ok {
		return
	}
	delete(v.m, key)
	if v.unsorted {
		v.keys = slices.DeleteFunc(v.keys, func(k string) bool { return k == key })
		return
	}
	if i, found := slices.BinarySearch(v.keys, key); found {
		v.keys = slices.Delete(v.keys, i, i+1)
	}
}

// Len returns the number of keys, included in states or not.
func (v *View[T]) Len() int { return len(v.m) }

// Count returns how many values, included in states or not, satisfy f.
func (v *View[T]) Count(f func(T) bool) int {
	n := 0
	for _, it := range v.m {
		if f(it.v) {
			n++
		}
	}
	return n
}

// Entries returns the included entries, sorted by key, in a new slice, and
// how many of them gRPC cannot dial.
func (v *View[T]) Entries() (entries []Entry, undialable int) {
	if v.unsorted {
		slices.Sort(v.keys)
		v.unsorted = false
	}
	entries = make([]Entry, 0, len(v.keys))
	for _, k := range v.keys {
		it := v.m[k]
		if !it.include {
			continue
		}
		if it.e.undialable {
			undialable++
		}
		entries = append(entries, it.e)
	}
	return entries, undialable
}
