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
// The join also keeps, per service (namespace/component/endpoint: the
// key up to its last "/"), how many instances declare a check and which
// of those are failing, and decides the service's panic: when more than
// the threshold of its checked instances are failing, each failing one
// carries Health.Panic (and is served: Instance.Serving). Its owner
// applies a batch of changes, then settles the services whose counts
// changed, so that a service passes no intermediate state of a batch, and
// replaces the items of the failing instances of every service that
// entered or left panic. A Board logs and counts the services entering
// and leaving panic.
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

// InPanic reports whether a service with checked instances, failing of
// them failing, is in panic under threshold (negative: never).
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
type serviceHealth struct {
	prefix  string          // the instances' key prefix
	name    string          // namespace/component/endpoint
	checked int             // instances that declare a check
	failing map[string]bool // keys of the checked instances that are failing
	panic   bool
}

// PanicChange is a service entering (or leaving) panic: its failing
// instances' Health.Panic changes.
type PanicChange struct {
	Service          string // namespace/component/endpoint
	Enter            bool
	Checked, Failing int
	Keys             []string // the failing instances' keys, in key order
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
// Panic set on a failing one whose service is in panic.
func (j *Join) Health(key string, in beacon.Instance) *beacon.Health {
	if in.Check == nil {
		return nil
	}
	h, ok := j.stored[key]
	if !ok {
		h = beacon.Health{Status: beacon.HealthUnknown}
	}
	if s := j.services[servicePrefix(key)]; s != nil && h.Status == beacon.HealthFailing {
		h.Panic = s.panic
	}
	return &h
}

// Count moves the service counts from old to cur, the instance at key
// before and after a change (nil: absent), as joined.
func (j *Join) Count(key string, old, cur *beacon.Instance) {
	oc, of := tally(old)
	nc, nf := tally(cur)
	if oc == nc && of == nf {
		return
	}
	p := servicePrefix(key)
	s := j.services[p]
	if s == nil {
		in := cur
		if in == nil {
			in = old
		}
		s = &serviceHealth{prefix: p, name: in.Namespace + "/" + in.Component + "/" + in.Endpoint, failing: make(map[string]bool)}
		j.services[p] = s
	}
	switch {
	case nc && !oc:
		s.checked++
	case oc && !nc:
		s.checked--
	}
	if nf {
		s.failing[key] = true
	} else {
		delete(s.failing, key)
	}
	j.dirty[s] = true
}

// tally is what the instance in (nil: absent) counts for its service.
func tally(in *beacon.Instance) (checked, failing bool) {
	if in == nil || in.Check == nil {
		return false, false
	}
	return true, in.Health != nil && in.Health.Status == beacon.HealthFailing
}

// Settle decides the panic of every service whose counts changed since
// the last settle, and returns those that entered or left it, by name.
func (j *Join) Settle() []PanicChange {
	var out []PanicChange
	for s := range j.dirty {
		if p := InPanic(s.checked, len(s.failing), j.threshold); p != s.panic {
			s.panic = p
			out = append(out, s.change())
		}
		if s.checked == 0 {
			delete(j.services, s.prefix) // no panic without checked instances
		}
	}
	clear(j.dirty)
	if j.closed {
		return nil
	}
	slices.SortFunc(out, func(a, b PanicChange) int { return cmp.Compare(a.Service, b.Service) })
	return out
}

func (s *serviceHealth) change() PanicChange {
	return PanicChange{Service: s.name, Enter: s.panic, Checked: s.checked, Failing: len(s.failing),
		Keys: slices.Sorted(maps.Keys(s.failing))}
}

// Close ends the join (its feed stops): it returns every service in panic
// as leaving it, and settle reports nothing from then on.
func (j *Join) Close() []PanicChange {
	if j.closed {
		return nil
	}
	j.closed = true
	var out []PanicChange
	for _, s := range j.services {
		if s.panic {
			c := s.change()
			c.Enter = false
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b PanicChange) int { return cmp.Compare(a.Service, b.Service) })
	return out
}

// JoinAll joins the items of a listing, not yet in any view, with j's
// verdicts and counts them; it returns the services that entered panic.
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
// of its own). Its mutex is a leaf.
type Board struct {
	log       *slog.Logger
	gauge     func(delta int) // moves the gauge of services in panic
	threshold float64

	mu     sync.Mutex
	panics map[string]int // service → joins that see it in panic
}

// NewBoard returns a Board that logs to log and moves gauge.
func NewBoard(log *slog.Logger, gauge func(delta int), threshold float64) *Board {
	return &Board{log: log, gauge: gauge, threshold: threshold, panics: make(map[string]int)}
}

// Report notes a join's service entering or leaving panic: the first
// join to see it enter and the last to see it leave log it and move the
// gauge.
func (b *Board) Report(c PanicChange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.panics[c.Service]
	switch {
	case c.Enter:
		b.panics[c.Service] = n + 1
		if n > 0 {
			return
		}
		b.gauge(1)
		b.log.Warn("service in health panic: more of its checked instances are failing than the panic threshold allows; "+
			"serving its failing instances too", "service", c.Service, "failing", c.Failing, "checked", c.Checked, "threshold", b.threshold)
	case n > 1:
		b.panics[c.Service] = n - 1
	case n == 1:
		delete(b.panics, c.Service)
		b.gauge(-1)
		b.log.Info("service out of health panic: its failing instances are left out again",
			"service", c.Service, "failing", c.Failing, "checked", c.Checked, "threshold", b.threshold)
	}
}
