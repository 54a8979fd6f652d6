package registry

import (
	"errors"
	"fmt"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/store"
)

// The dynamo layout in the view.
//
// Each feed (and each List) keeps a dynamo.Catalog of the entries of its
// query, read from one store watch of Dynamo's root (v1/): instances and
// model cards arrive in one ordered stream. A store event changes at most
// one ref's served instance (the catalog says which), and the feed puts
// that instance in its view, or removes it, at the event's revision: a
// card written or deleted is an Updated event of its instance (its
// dynamo.models metadata), two instance entries of one ref (a padded and
// an unpadded ID) remove it until one goes. The view keys an instance by
// its ref (dynViewKey), never by one of its entries' keys, so that no two
// entries can hold one ref.
//
// An entry Beacon cannot serve (dynamo.EntryError) is reported once per
// key and revision — logged with the key and what was wrong, counted in
// beacon_registry_invalid_values_total — and skipped; a key that held a
// valid entry keeps it, as a Beacon key does, also across a re-listing.
// A collision is reported once per key and revision too.

// dynSource is what the registry keeps with each Dynamo entry.
type dynSource struct {
	create, mod int64
	lease       store.LeaseID
}

// dynRead is one stored key/value of the dynamo layout, read outside the
// feed's lock.
type dynRead struct {
	key string
	e   dynamo.Entry
	src dynSource
	ok  bool // an entry Beacon serves (an instance or a card)
	bad bool // an entry Beacon cannot serve (reported): keep the last valid one
}

// readDynamo decodes one key/value (put: false for a deletion), reporting
// an entry Beacon cannot serve.
func (r *StoreRegistry) readDynamo(kv store.KeyValue, put bool) dynRead {
	d := dynRead{key: kv.Key, src: dynSource{create: kv.CreateRevision, mod: kv.ModRevision, lease: kv.Lease}}
	if !put {
		return d
	}
	e, err := dynamo.Decode(kv.Key, kv.Value)
	switch {
	case errors.Is(err, dynamo.ErrNotServed):
	case err != nil:
		d.bad = true
		if r.dynBad.first(kv.Key, kv.ModRevision) {
			r.dynBad.log.Error("skipping a Dynamo entry Beacon cannot serve", "key", kv.Key, "revision", kv.ModRevision, "err", err)
		}
	default:
		d.e, d.ok = e, true
	}
	return d
}

// dynViewKey is the view's key of the instance at ref: Dynamo's instance
// key with the ID padded to 16 hex digits, so that one ref has one key and
// the view sorts as Beacon's does.
func dynViewKey(ref beacon.Ref) string {
	return dynamo.InstancesPrefix + ref.Namespace + "/" + ref.Component + "/" + ref.Endpoint + "/" + ref.ID
}

// dynView is the catalog of one query's Dynamo entries. Its owner's lock
// guards it (a feed's mu; a List owns its own).
type dynView struct {
	q   beacon.Query
	cat *dynamo.Catalog[dynSource]
	rep *reporter
}

func newDynView(q beacon.Query, rep *reporter) *dynView {
	return &dynView{q: q, cat: dynamo.NewCatalog[dynSource](), rep: rep}
}

// apply records one event: a put of d, or the deletion of its key. It
// returns the ref whose served instance may have changed.
func (v *dynView) apply(put bool, d dynRead) (beacon.Ref, bool) {
	if !put {
		return v.cat.Delete(d.key)
	}
	if !d.ok || !v.q.Matches(d.e.Parsed.Ref()) {
		return beacon.Ref{}, false // not served, malformed (the last valid entry stays), or another query's
	}
	ref := v.cat.Put(d.e, d.src)
	v.reportCollision(ref)
	return ref, true
}

// replace loads a listing: the catalog is rebuilt from reads, but a key
// whose value is not an entry Beacon serves keeps the entry it held.
func (v *dynView) replace(reads []dynRead) {
	old := v.cat
	v.cat = dynamo.NewCatalog[dynSource]()
	for _, d := range reads {
		if d.bad {
			if e, src, ok := old.Get(d.key); ok {
				d.e, d.src, d.ok = e, src, true
			}
		}
		v.apply(true, d)
	}
}

// reportCollision reports each key of a collision at ref once per key and
// revision.
func (v *dynView) reportCollision(ref beacon.Ref) {
	keys := v.cat.Colliding(ref)
	for _, key := range keys {
		_, src, _ := v.cat.Get(key)
		if v.rep.first(key, src.mod) {
			v.rep.log.Error("skipping Dynamo entries whose instance IDs are one Beacon ID (a padded and an unpadded ID?): neither is served while both exist",
				"key", key, "revision", src.mod, "err", errCollision{ref: ref, keys: keys})
		}
	}
}

type errCollision struct {
	ref  beacon.Ref
	keys []string
}

func (e errCollision) Error() string {
	return fmt.Sprintf("the keys %q all map to %s: delete the one that is stale", e.keys, e.ref)
}

// item returns the view's item of the instance served at ref, at rev
// (0: the latest revision of its entries), or false when none is.
func (v *dynView) item(ref beacon.Ref, rev int64) (*item, bool) {
	s, ok := v.cat.Lookup(ref)
	if !ok {
		return nil, false
	}
	if rev == 0 {
		rev = s.Source.mod
		for _, m := range s.Models {
			rev = max(rev, m.Source.mod)
		}
	}
	return &item{Key: dynViewKey(ref), Inst: s.Instance, Create: s.Source.create, Mod: s.Source.mod, Rev: rev,
		Lease: s.Source.lease}, true
}

// items returns the items of every instance served, sorted by key.
func (v *dynView) items() []*item {
	refs := v.cat.Refs()
	out := make([]*item, 0, len(refs))
	for _, ref := range refs {
		if it, ok := v.item(ref, 0); ok {
			out = append(out, it)
		}
	}
	return out
}

// applyDynamoLocked applies one event of the dynamo layout at rev: the
// instance whose served state it may change is put in the view, or
// removed from it.
func (f *feed) applyDynamoLocked(put bool, d *dynRead, rev int64, now time.Time) {
	ref, ok := f.dyn.apply(put, *d)
	if !ok {
		return
	}
	key := dynViewKey(ref)
	if it, served := f.dyn.item(ref, rev); served {
		f.rewrittenLocked(key)
		f.putLocked(it, rev)
		return
	}
	if old, held := f.view.Get(key); held {
		f.removeLocked(old, rev, rev, now)
	}
}
