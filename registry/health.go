package registry

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// Health in the view.
//
// A checker's verdict on an instance is stored beside it, at the
// instance's key followed by "/health" (beacon.Keyspace.HealthKey), bound
// to the checker's lease: the JSON of a beacon.Health, without Panic. A
// TTL check's report, at the instance's key followed by "/report"
// (ReportKey), is for the checker to read; the view ignores it. Both live
// under their instance's key, so one store watch of any prefix delivers
// instances and verdicts in one ordered stream.
//
// A feed keeps the verdicts of its prefix in a healthJoin and joins them
// to its instances: an instance that declares a Check carries its
// verdict, or Health{Status: unknown} while there is none; an instance
// that declares none carries no Health, whatever is stored; and what a
// stored instance value says about its health is always replaced. A
// verdict without its instance is kept aside (the instance may be written
// again with the same ID after a lease loss) and joined when it appears.
//
// The join also keeps, per service (namespace/component/endpoint), how
// many instances declare a check and which of those are failing, and
// decides the service's panic: when more than Config.HealthPanicThreshold
// of its checked instances are failing, each failing one carries
// Health.Panic (and is served: Instance.Serving). The feed applies a
// batch of changes, then settles the services whose counts changed, so
// that a service passes no intermediate state of a batch, and replaces
// the items of the failing instances of every service that entered or
// left panic. Entering and leaving are reported to the registry's
// healthBoard, which logs and counts each service once, however many
// feeds see it.

// keyKind is what a key under the services prefix holds.
type keyKind uint8

const (
	instanceKey keyKind = iota // an instance, or something that is not one
	verdictKey                 // a checker's verdict on an instance
	reportKey                  // a TTL check's report
	dynamoKey                  // a key of the dynamo layout (dynview.go)
)

// classify tells a verdict's and a report's key from an instance's, and
// returns the key of the instance it is about (key itself for any other).
func (r *StoreRegistry) classify(key string) (keyKind, string) {
	if _, ok := r.ks.ParseHealthKey(key); ok {
		return verdictKey, strings.TrimSuffix(key, beacon.HealthSuffix)
	}
	if ikey, ok := strings.CutSuffix(key, ReportSuffix); ok {
		if _, err := r.ks.Parse(ikey); err == nil {
			return reportKey, ikey
		}
	}
	return instanceKey, key
}

// decodeVerdict reads a stored verdict. Panic is the view's to decide:
// what the value says of it is dropped.
func decodeVerdict(val []byte) (beacon.Health, error) {
	var h beacon.Health
	if err := decodeOne(val, &h); err != nil {
		return h, fmt.Errorf("decode verdict: %w", err)
	}
	switch h.Status {
	case beacon.HealthUnknown, beacon.HealthPassing, beacon.HealthFailing:
	default:
		return h, fmt.Errorf("decode verdict: status %q is not unknown, passing or failing", h.Status)
	}
	h.Panic = false
	return h, nil
}

// decodeOne decodes val, one JSON value holding text that decodes without
// loss (beacon.ValidateJSONText), into v.
func decodeOne(val []byte, v any) error {
	if err := beacon.ValidateJSONText(val); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(val))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// inPanic reports whether a service with checked instances, failing of
// them failing, is in panic under threshold (negative: never).
func inPanic(checked, failing int, threshold float64) bool {
	return threshold >= 0 && checked > 0 && float64(failing) > threshold*float64(checked)
}

// healthJoin holds the verdicts of one feed's prefix and the health of its
// services. It is bookkeeping only: the feed's mu guards it, and the feed
// replaces its items as the join says.
type healthJoin struct {
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

// panicChange is a service entering (or leaving) panic: its failing
// instances' Health.Panic changes.
type panicChange struct {
	service          string
	enter            bool
	checked, failing int
	keys             []string // the failing instances, in key order
}

func newHealthJoin(threshold float64) *healthJoin {
	return &healthJoin{threshold: threshold, stored: make(map[string]beacon.Health),
		services: make(map[string]*serviceHealth), dirty: make(map[*serviceHealth]bool)}
}

// setVerdict records h as the verdict on the instance at key and reports
// whether that changed it.
func (j *healthJoin) setVerdict(key string, h beacon.Health) bool {
	h.Panic = false
	if old, ok := j.stored[key]; ok && sameHealth(&old, &h) {
		return false
	}
	j.stored[key] = h
	return true
}

// deleteVerdict forgets the verdict on the instance at key and reports
// whether there was one.
func (j *healthJoin) deleteVerdict(key string) bool {
	_, ok := j.stored[key]
	delete(j.stored, key)
	return ok
}

// replaceVerdicts makes the verdicts of a listing the only ones, and
// returns the keys of the instances whose verdict changed, sorted.
func (j *healthJoin) replaceVerdicts(listed map[string]beacon.Health) []string {
	var changed []string
	for key := range j.stored {
		if _, ok := listed[key]; !ok {
			delete(j.stored, key)
			changed = append(changed, key)
		}
	}
	for key, h := range listed {
		if j.setVerdict(key, h) {
			changed = append(changed, key)
		}
	}
	slices.Sort(changed)
	return changed
}

// health returns the Health the instance in, stored at key, carries: nil
// without a check, else its verdict (unknown while there is none), with
// Panic set on a failing one whose service is in panic.
func (j *healthJoin) health(key string, in beacon.Instance) *beacon.Health {
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

// count moves the service counts from old to cur, the instance at key
// before and after a change (nil: absent), as joined.
func (j *healthJoin) count(key string, old, cur *beacon.Instance) {
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

// settle decides the panic of every service whose counts changed since
// the last settle, and returns those that entered or left it, by name.
func (j *healthJoin) settle() []panicChange {
	var out []panicChange
	for s := range j.dirty {
		if p := inPanic(s.checked, len(s.failing), j.threshold); p != s.panic {
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
	slices.SortFunc(out, func(a, b panicChange) int { return cmp.Compare(a.service, b.service) })
	return out
}

func (s *serviceHealth) change() panicChange {
	return panicChange{service: s.name, enter: s.panic, checked: s.checked, failing: len(s.failing),
		keys: slices.Sorted(maps.Keys(s.failing))}
}

// close ends the join (its feed stops): it returns every service in panic
// as leaving it, and settle reports nothing from then on.
func (j *healthJoin) close() []panicChange {
	if j.closed {
		return nil
	}
	j.closed = true
	var out []panicChange
	for _, s := range j.services {
		if s.panic {
			c := s.change()
			c.enter = false
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b panicChange) int { return cmp.Compare(a.service, b.service) })
	return out
}

// joinAll joins the items of a listing, not yet in any view, with j's
// verdicts and counts them; it returns the services that entered panic.
func (j *healthJoin) joinAll(items []*item) []panicChange {
	for _, it := range items {
		it.Inst.Health = j.health(it.Key, it.Inst)
		j.count(it.Key, nil, &it.Inst)
	}
	changes := j.settle()
	if len(changes) > 0 {
		for _, it := range items {
			it.Inst.Health = j.health(it.Key, it.Inst)
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

// healthBoard is what a registry's feeds report about health, counted
// once per registry: a service is in the prefix of every feed of its
// namespace, of the root and of its own, each with a join of its own.
// Lock order: feed.mu before healthBoard.mu.
type healthBoard struct {
	log       *slog.Logger
	m         *metrics
	threshold float64

	bad *reporter // malformed verdicts

	mu     sync.Mutex
	panics map[string]int // service → feeds that see it in panic
}

// maxBadVerdicts bounds the malformed verdicts remembered as reported.
const maxBadVerdicts = 1024

func newHealthBoard(log *slog.Logger, m *metrics, threshold float64) *healthBoard {
	return &healthBoard{log: log, m: m, threshold: threshold, panics: make(map[string]int), bad: newReporter(log, m, maxBadVerdicts)}
}

// report notes a feed's service entering or leaving panic: the first
// feed to see it enter and the last to see it leave log it and move the
// gauge.
func (b *healthBoard) report(c panicChange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.panics[c.service]
	switch {
	case c.enter:
		b.panics[c.service] = n + 1
		if n > 0 {
			return
		}
		b.m.addHealthPanics(1)
		b.log.Warn("service in health panic: more of its checked instances are failing than the panic threshold allows; "+
			"serving its failing instances too", "service", c.service, "failing", c.failing, "checked", c.checked, "threshold", b.threshold)
	case n > 1:
		b.panics[c.service] = n - 1
	case n == 1:
		delete(b.panics, c.service)
		b.m.addHealthPanics(-1)
		b.log.Info("service out of health panic: its failing instances are left out again",
			"service", c.service, "failing", c.failing, "checked", c.checked, "threshold", b.threshold)
	}
}

// malformed reports a stored verdict that is not one, once per key and
// revision; the view reads it as no verdict.
func (b *healthBoard) malformed(key string, rev int64, err error) {
	if b.bad.first(key, rev) {
		b.bad.log.Warn("a stored health verdict is not valid; reading it as no verdict (health unknown)", "key", key, "revision", rev, "err", err)
	}
}

// readKV reads one stored key/value (put: false for a deletion, which has
// no value) as an entry: an instance (nil item if its value is not one,
// reported), a verdict (nil if malformed, reported) or a report.
func (r *StoreRegistry) readKV(kv store.KeyValue, put bool) entry {
	if r.dynamo() {
		d := r.readDynamo(kv, put)
		return entry{kind: dynamoKey, key: kv.Key, dyn: &d}
	}
	kind, key := r.classify(kv.Key)
	e := entry{kind: kind, key: key}
	switch {
	case !put || kind == reportKey:
	case kind == verdictKey:
		h, err := decodeVerdict(kv.Value)
		if err != nil {
			r.health.malformed(kv.Key, kv.ModRevision, err)
			break
		}
		e.verdict = &h
	default:
		in, err := r.decode(kv)
		if err != nil {
			r.invalidValue(kv.Key, err)
			break
		}
		e.it = &item{Key: kv.Key, Inst: in, Create: kv.CreateRevision, Mod: kv.ModRevision, Rev: kv.ModRevision,
			Lease: kv.Lease, TTL: storedTTL(kv.Value)}
	}
	return e
}

// entry is one stored key/value as the view reads it.
type entry struct {
	kind    keyKind
	key     string         // the key of the instance it is about
	it      *item          // an instance (nil: a deletion, or not a valid value)
	verdict *beacon.Health // a verdict (nil: a deletion, or malformed: no verdict)
	dyn     *dynRead       // an entry of the dynamo layout
}

// listing is a listing of a prefix as the view reads it.
type listing struct {
	items    []*item                  // valid instances, in key order
	verdicts map[string]beacon.Health // valid verdicts by instance key
	invalid  map[string]bool          // instance keys whose values are not instances
	dyn      []dynRead                // the dynamo layout's key/values (its view makes the items)
}

func (r *StoreRegistry) readListing(kvs []store.KeyValue) listing {
	if r.dynamo() {
		l := listing{verdicts: make(map[string]beacon.Health), dyn: make([]dynRead, len(kvs))}
		for i, kv := range kvs {
			l.dyn[i] = r.readDynamo(kv, true)
		}
		return l
	}
	l := listing{items: make([]*item, 0, len(kvs)), verdicts: make(map[string]beacon.Health)}
	for _, kv := range kvs {
		e := r.readKV(kv, true)
		switch {
		case e.kind == verdictKey && e.verdict != nil:
			l.verdicts[e.key] = *e.verdict
		case e.kind != instanceKey:
		case e.it != nil:
			l.items = append(l.items, e.it)
		default:
			if l.invalid == nil {
				l.invalid = make(map[string]bool)
			}
			l.invalid[kv.Key] = true
		}
	}
	return l
}
