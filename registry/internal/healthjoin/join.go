// Package healthjoin joins checkers' verdicts to the instances of a
// registry's view, and decides each service's panic: the one
// implementation both registries share (registry's feeds over a store,
// registry/kube's view of InstanceSets).
//
// A Join keeps the verdicts of its view and joins them to its instances:
// an instance that declares a Check carries its verdict, or
// Health{Status: unknown} while there is none; an instance that declares
// none carries no Health, whatever is stored; and what a stored instance
// value says about its health is always replaced. A verdict without its
// instance is kept aside (the instance may come back with the same ID)
// and joined when it appears.
//
// Panic is judged per priority level, as Envoy judges it, so that failover
// comes first. The levels of a service (namespace/component/endpoint: the
// key up to its last "/") are its instances' distinct priorities
// (beacon.MetaPriority, lower first). A level is in panic when more than
// the threshold of its checked instances are failing (InPanic) and no
// other level has an instance that takes work — not draining, and not
// failing by its own check (passing, unknown or unchecked). Clients send
// their calls to the first level with such an instance: a later one is
// where they fail over to, an earlier one keeps them (and consumers blind
// to priorities, such as DNS A records and the beacon:/// resolver, would
// otherwise mix a failing backup tier into a healthy primary one). Each
// failing instance of a level in panic carries Health.Panic (and is
// served: Instance.Serving); the failing instances of any other level are
// left out. With one level this is the threshold over the whole service.
//
// The join keeps, per level, how many instances it holds, how many
// declare a check, how many take work and which checked ones are
// failing. Its owner applies a batch of changes, then settles the services
// whose counts changed, so that a service passes no intermediate state of
// a batch, and replaces the items of the failing instances of every level
// that entered or left panic. A Board logs and counts the services
// entering and leaving panic (a service is in panic while any of its
// levels is).
package healthjoin

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/view"
)

// InPanic reports whether a level with checked instances, failing of
// them failing, is over threshold (negative: never). A level over it is
// in panic unless another level takes work (see the package doc).
func InPanic(checked, failing int, threshold float64) bool {
	return threshold >= 0 && checked > 0 && float64(failing) > threshold*float64(checked)
}

// Join holds the verdicts of one view and the health of its services.
// It is bookkeeping only: its owner's mutex guards it, and the owner
// replaces its items as the join says.
type Join struct {
	threshold float64
	stored    map[string]beacon.Health  // instance key → its verdict as stored
	services  map[string]*serviceHealth // service prefix → its counts
	dirty     map[*serviceHealth]bool   // counts changed since settle
	closed    bool                      // settle reports nothing any more
}

// serviceHealth is one service's counts, as the items in the view say.
// It is kept while the service has instances, checked or not: an
// unchecked one takes work, and keeps the other levels out of panic.
type serviceHealth struct {
	prefix string                  // the instances' key prefix
	name   string                  // namespace/component/endpoint
	levels map[uint16]*levelHealth // priority → its counts
}

// levelHealth is the counts of one priority level of a service.
type levelHealth struct {
	instances int             // instances at this priority
	checked   int             // of them, those that declare a check
	working   int             // of them, those that take work (tally)
	failing   map[string]bool // keys of the checked instances that are failing
	panic     bool
}

// PanicChange is one priority level of a service entering (or leaving)
// panic: its failing instances' Health.Panic changes.
type PanicChange struct {
	Service          string // namespace/component/endpoint
	Priority         uint16 // the level
	Enter            bool
	Checked, Failing int      // the level's counts
	Keys             []string // the level's failing instances' keys, in key order
}

// New returns an empty Join; threshold is the panic threshold (see
// InPanic).
func New(threshold float64) *Join {
	return &Join{threshold: threshold, stored: make(map[string]beacon.Health),
		services: make(map[string]*serviceHealth), dirty: make(map[*serviceHealth]bool)}
}

// SetVerdict records h as the verdict on the instance at key and reports
// whether that changed it.
func (j *Join) SetVerdict(key string, h beacon.Health) bool {
	h.Panic = false
	if old, ok := j.stored[key]; ok && sameHealth(&old, &h) {
		return false
	}
	j.stored[key] = h
	return true
}

// DeleteVerdict forgets the verdict on the instance at key and reports
// whether there was one.
func (j *Join) DeleteVerdict(key string) bool {
	_, ok := j.stored[key]
	delete(j.stored, key)
	return ok
}

// ReplaceVerdicts makes the verdicts of a listing the only ones, and
// returns the keys of the instances whose verdict changed, sorted.
func (j *Join) ReplaceVerdicts(listed map[string]beacon.Health) []string {
	var changed []string
	for key := range j.stored {
		if _, ok := listed[key]; !ok {
			delete(j.stored, key)
			changed = append(changed, key)
		}
	}
	for key, h := range listed {
		if j.SetVerdict(key, h) {
			changed = append(changed, key)
		}
	}
	slices.Sort(changed)
	return changed
}

// Health returns the Health the instance in, stored at key, carries: nil
// without a check, else its verdict (unknown while there is none), with
// Panic set on a failing one whose level is in panic.
func (j *Join) Health(key string, in beacon.Instance) *beacon.Health {
	if in.Check == nil {
		return nil
	}
	h, ok := j.stored[key]
	if !ok {
		h = beacon.Health{Status: beacon.HealthUnknown}
	}
	if h.Status == beacon.HealthFailing {
		h.Panic = j.levelInPanic(key, priority(&in))
	}
	return &h
}

// levelInPanic reports whether the level prio of the service of the
// instance at key is in panic, as last settled.
func (j *Join) levelInPanic(key string, prio uint16) bool {
	s := j.services[servicePrefix(key)]
	if s == nil {
		return false
	}
	l := s.levels[prio]
	return l != nil && l.panic
}

// priority is the level of in: the priority DNS and xDS route it with.
func priority(in *beacon.Instance) uint16 {
	p, _ := beacon.Uint16Meta(in.Metadata, beacon.MetaPriority, beacon.DefaultPriority)
	return p
}

// Count moves the service counts from old to cur, the instance at key
// before and after a change (nil: absent), as joined. Every instance is
// counted, checked or not: one that takes work keeps the other levels out
// of panic, and an instance may change its priority or its status.
func (j *Join) Count(key string, old, cur *beacon.Instance) {
	om, cm := tally(old), tally(cur)
	if om == cm {
		return
	}
	s := j.service(key, cmp.Or(cur, old)) // the one not nil
	s.add(key, om, -1)
	s.add(key, cm, +1)
	j.dirty[s] = true
}

// service returns the counts of the service of the instance in, at key,
// made if there are none.
func (j *Join) service(key string, in *beacon.Instance) *serviceHealth {
	p := servicePrefix(key)
	s := j.services[p]
	if s == nil {
		s = &serviceHealth{prefix: p, name: in.Namespace + "/" + in.Component + "/" + in.Endpoint,
			levels: make(map[uint16]*levelHealth)}
		j.services[p] = s
	}
	return s
}

// mark is what one instance counts for its service.
type mark struct {
	present bool   // the instance exists
	level   uint16 // its priority
	// it declares a check; the check fails; it takes work (tally)
	checked, failing, working bool
}

// tally is what the instance in (nil: absent) counts for its service. A
// failing instance does not take work even while its level's panic serves
// it: a level in panic is no failover for another.
func tally(in *beacon.Instance) mark {
	if in == nil {
		return mark{}
	}
	failing := in.Check != nil && in.Health != nil && in.Health.Status == beacon.HealthFailing
	return mark{present: true, checked: in.Check != nil, failing: failing, working: !failing && in.Serving(), level: priority(in)}
}

// add adds the instance at key, counted as m, to its level (d = 1), or
// takes it away (d = -1).
func (s *serviceHealth) add(key string, m mark, d int) {
	if !m.present {
		return
	}
	l := s.levels[m.level]
	if l == nil {
		l = &levelHealth{failing: make(map[string]bool)}
		s.levels[m.level] = l
	}
	l.instances += d
	if m.checked {
		l.checked += d
	}
	if m.working {
		l.working += d
	}
	switch {
	case m.failing && d > 0:
		l.failing[key] = true
	case m.failing:
		delete(l.failing, key)
	}
}

// Settle decides the panic of every level of every service whose counts
// changed since the last settle, and returns the levels that entered or
// left it, by service and priority.
func (j *Join) Settle() []PanicChange {
	var out []PanicChange
	for s := range j.dirty {
		out = s.settle(j.threshold, out)
		if len(s.levels) == 0 {
			delete(j.services, s.prefix) // no instances: nothing to count
		}
	}
	clear(j.dirty)
	if j.closed {
		return nil
	}
	slices.SortFunc(out, byLevel)
	return out
}

// settle decides the panic of each level of s, appends those that
// flipped to out, and forgets the levels left without instances.
func (s *serviceHealth) settle(threshold float64, out []PanicChange) []PanicChange {
	working := 0
	for _, l := range s.levels {
		working += l.working
	}
	for _, p := range slices.Sorted(maps.Keys(s.levels)) {
		l := s.levels[p]
		// Another level that takes work is where clients go: an earlier
		// one keeps them, a later one takes them over.
		if inPanic := l.working == working && InPanic(l.checked, len(l.failing), threshold); inPanic != l.panic {
			l.panic = inPanic
			out = append(out, s.change(p))
		}
		if l.instances == 0 {
			delete(s.levels, p) // and so not in panic: it has no checked instance
		}
	}
	return out
}

// change is the level prio of s entering or leaving panic, as it now is.
func (s *serviceHealth) change(prio uint16) PanicChange {
	l := s.levels[prio]
	return PanicChange{Service: s.name, Priority: prio, Enter: l.panic, Checked: l.checked, Failing: len(l.failing),
		Keys: slices.Sorted(maps.Keys(l.failing))}
}

func byLevel(a, b PanicChange) int {
	return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Priority, b.Priority))
}

// Close ends the join (its feed stops): it returns every level in panic
// as leaving it, and settle reports nothing from then on.
func (j *Join) Close() []PanicChange {
	if j.closed {
		return nil
	}
	j.closed = true
	var out []PanicChange
	for _, s := range j.services {
		for p, l := range s.levels {
			if l.panic {
				c := s.change(p)
				c.Enter = false
				out = append(out, c)
			}
		}
	}
	slices.SortFunc(out, byLevel)
	return out
}

// JoinAll joins the items of a listing, not yet in any view, with j's
// verdicts and counts them; it returns the levels that entered panic.
func (j *Join) JoinAll(items []*view.Item) []PanicChange {
	for _, it := range items {
		it.Inst.Health = j.Health(it.Key, it.Inst)
		j.Count(it.Key, nil, &it.Inst)
	}
	changes := j.Settle()
	if len(changes) > 0 {
		for _, it := range items {
			it.Inst.Health = j.Health(it.Key, it.Inst)
		}
	}
	return changes
}

// servicePrefix returns the key prefix of the service of the instance at
// key (up to and with its last "/").
func servicePrefix(key string) string { return key[:strings.LastIndexByte(key, '/')+1] }

func sameHealth(a, b *beacon.Health) bool {
	return (beacon.Instance{Health: a}).Equal(beacon.Instance{Health: b})
}

// Board logs and counts the services entering and leaving panic, each
// once however many joins see it (a store registry has a join per watched
// prefix, and a service is in the prefix of its namespace, of the root and
// of its own). A service is in panic while any of its levels is; each
// level entering and leaving is logged, naming its priority. Its mutex is
// a leaf.
type Board struct {
	log       *slog.Logger
	gauge     func(delta int) // moves the gauge of services in panic
	threshold float64

	mu     sync.Mutex
	panics map[string]map[uint16]int // service → level in panic → joins that see it so
}

// NewBoard returns a Board that logs to log and moves gauge.
func NewBoard(log *slog.Logger, gauge func(delta int), threshold float64) *Board {
	return &Board{log: log, gauge: gauge, threshold: threshold, panics: make(map[string]map[uint16]int)}
}

// Report notes a join's level entering or leaving panic: the first join
// to see it enter and the last to see it leave log it, and move the gauge
// when it is the service's first level in panic or its last.
func (b *Board) Report(c PanicChange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	levels := b.panics[c.Service]
	n := levels[c.Priority]
	switch {
	case c.Enter:
		if levels == nil {
			levels = make(map[uint16]int)
			b.panics[c.Service] = levels
		}
		levels[c.Priority] = n + 1
		if n == 0 {
			b.entered(c, len(levels) == 1)
		}
	case n > 1:
		levels[c.Priority] = n - 1
	case n == 1:
		delete(levels, c.Priority)
		if len(levels) == 0 {
			delete(b.panics, c.Service)
		}
		b.left(c, len(levels) == 0)
	}
}

// entered logs a level entering panic; first: the service's first.
func (b *Board) entered(c PanicChange, first bool) {
	if !first {
		b.log.Warn("another priority of a service in health panic: more of its checked instances are failing than the panic threshold allows, "+
			"and no other priority has an instance that takes work; serving its failing instances too", b.attrs(c)...)
		return
	}
	b.gauge(1)
	b.log.Warn("service in health panic: more of the checked instances of a priority are failing than the panic threshold allows, "+
		"and no other priority has an instance that takes work; serving its failing instances too", b.attrs(c)...)
}

// left logs a level leaving panic; last: the service's last.
func (b *Board) left(c PanicChange, last bool) {
	if !last {
		b.log.Info("a priority of a service out of health panic, others still in it: its failing instances are left out again", b.attrs(c)...)
		return
	}
	b.gauge(-1)
	b.log.Info("service out of health panic: its failing instances are left out again", b.attrs(c)...)
}

// attrs are what a log line of the level c says of it.
func (b *Board) attrs(c PanicChange) []any {
	return []any{"service", c.Service, "priority", c.Priority, "failing", c.Failing, "checked", c.Checked, "threshold", b.threshold}
}
