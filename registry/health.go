package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/healthjoin"
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
// A feed keeps the verdicts of its prefix in a healthjoin.Join (shared
// with registry/kube's view) and joins them to its instances (an
// instance that declares a Check carries its verdict, or unknown), and
// decides the panic of each priority level of each service
// (Config.HealthPanicThreshold): see package healthjoin. The feed applies a
// batch of changes, then settles the services whose counts changed, and
// replaces the items of the failing instances of every level that entered
// or left panic. Entering and leaving are reported to the registry's
// healthBoard, which logs each level and counts each service once, however
// many feeds see it.

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

// healthBoard is what a registry's feeds report about health: the
// services in panic, counted once per registry (healthjoin.Board), and
// the malformed verdicts.
type healthBoard struct {
	*healthjoin.Board
	bad *reporter // malformed verdicts
}

// maxBadVerdicts bounds the malformed verdicts remembered as reported.
const maxBadVerdicts = 1024

func newHealthBoard(log *slog.Logger, m *metrics, threshold float64) *healthBoard {
	return &healthBoard{Board: healthjoin.NewBoard(log, m.addHealthPanics, threshold), bad: newReporter(log, m, maxBadVerdicts)}
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
