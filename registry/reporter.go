package registry

import (
	"log/slog"
	"sync"
)

// reporter logs and counts (beacon_registry_invalid_values_total) each
// stored value the view cannot use once per key and revision, however many
// feeds read it: a malformed health verdict, a Dynamo entry Beacon cannot
// serve. It remembers at most limit keys; past them it forgets them all
// (a value may then be reported once more). Its mu is a leaf lock.
type reporter struct {
	log   *slog.Logger
	m     *metrics
	limit int
	mu    sync.Mutex
	seen  map[string]int64 // key -> revision reported
}

func newReporter(log *slog.Logger, m *metrics, limit int) *reporter {
	return &reporter{log: log, m: m, limit: limit, seen: make(map[string]int64)}
}

// first counts the value at key and rev and reports whether it is the
// first time: the caller then logs it (with p.log, the key, the revision
// and why).
func (p *reporter) first(key string, rev int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.seen[key]; ok && r == rev {
		return false
	}
	if len(p.seen) >= p.limit {
		clear(p.seen)
	}
	p.seen[key] = rev
	p.m.invalidValue()
	return true
}
