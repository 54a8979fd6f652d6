package view

import (
	"sync"
	"sync/atomic"

	"github.com/beaconplane/beacon"
)

// Memo shares the events between two versions among the watchers that
// ask for the same pair: every watcher of a feed that kept up holds the
// same version, and when the view moves on each asks for the same
// difference. The first to ask computes it; the others wait for that
// computation and copy its result, so that a change reaching N watchers
// costs one diff and N copies, not N diffs. It remembers the last pair
// only. Each caller gets events of its own (instances cloned): a watcher
// that changes its batch changes no other's.
//
// Its zero value is ready. compute must be a function of the pair alone
// (the same versions give the same events), which DiffLog and DiffTrees
// are.
type Memo struct {
	mu   sync.Mutex // taken only to replace last
	last atomic.Pointer[memoEntry]
}

type memoEntry struct {
	old, cur *Version
	once     sync.Once
	events   []beacon.Event // never given out: each caller gets a copy
}

// Events returns the events from old to cur, computed by compute unless
// another caller computes or computed them for the same pair.
func (m *Memo) Events(old, cur *Version, compute func() []beacon.Event) []beacon.Event {
	e := m.entry(old, cur)
	e.once.Do(func() { e.events = compute() })
	return cloneEvents(e.events)
}

// entry returns the entry of the pair, replacing the last one if it is of
// another pair. Those asking for the remembered pair take no lock.
func (m *Memo) entry(old, cur *Version) *memoEntry {
	if e := m.last.Load(); e != nil && e.old == old && e.cur == cur {
		return e
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.last.Load(); e != nil && e.old == old && e.cur == cur {
		return e
	}
	e := &memoEntry{old: old, cur: cur}
	m.last.Store(e)
	return e
}

func cloneEvents(events []beacon.Event) []beacon.Event {
	if events == nil {
		return nil
	}
	out := make([]beacon.Event, len(events))
	for i, ev := range events {
		ev.Instance = ev.Instance.Clone()
		out[i] = ev
	}
	return out
}
