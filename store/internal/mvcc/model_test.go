package mvcc_test

import (
	"errors"
	"maps"
	"slices"
	"strings"

	"github.com/beaconplane/beacon/store"
)

// model is the test oracle: the store contract written as plainly as
// possible, sharing no code with the package under test. A change is
// applied to it and to the Store, and their outcomes compared.
type model struct {
	rev    int64
	kvs    map[string]store.KeyValue
	events []store.Event
	alive  map[store.LeaseID]bool // leases writes may bind
}

func newModel() *model {
	return &model{rev: 1, kvs: map[string]store.KeyValue{}, alive: map[store.LeaseID]bool{}}
}

var errLease = errors.New("model: lease not alive")

// leaseAlive is the LeaseAlive hook both sides use.
func (m *model) leaseAlive(id store.LeaseID) error {
	if !m.alive[id] {
		return errLease
	}
	return nil
}

// op is one change in the model's terms.
type op struct {
	kind      string // create put update delete txn endlease
	key       string
	value     string
	rev       int64 // update: expected; delete: if-mod-revision
	lease     store.LeaseID
	keepLease bool
	ops       []store.Op
}

// apply applies o and returns the sentinel the Store must match (nil on
// success).
func (m *model) apply(o op) error {
	next := m.rev + 1
	var evs []store.Event
	put := func(key string, value []byte, lease store.LeaseID) {
		kv := store.KeyValue{Key: key, Value: append([]byte{}, value...), CreateRevision: next, ModRevision: next, Lease: lease}
		if old, ok := m.kvs[key]; ok {
			kv.CreateRevision = old.CreateRevision
		}
		evs = append(evs, store.Event{Type: store.EventPut, KV: kv})
	}
	del := func(key string) {
		evs = append(evs, store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: key, ModRevision: next}})
	}
	old, exists := m.kvs[o.key]
	switch o.kind {
	case "create", "put", "update":
		switch {
		case o.kind == "create" && exists:
			return store.ErrKeyExists
		case o.kind == "update" && !exists:
			return store.ErrNotFound
		case o.kind == "update" && old.ModRevision != o.rev:
			return store.ErrConflict
		}
		lease := o.lease
		if o.keepLease {
			if !exists {
				return store.ErrNotFound
			}
			lease = old.Lease
		}
		if lease != store.NoLease && !m.alive[lease] {
			return errLease
		}
		put(o.key, []byte(o.value), lease)
	case "delete":
		switch {
		case !exists:
			return store.ErrNotFound
		case o.rev != 0 && old.ModRevision != o.rev:
			return store.ErrConflict
		}
		del(o.key)
	case "txn":
		for _, x := range o.ops {
			cur, ok := m.kvs[x.Key]
			switch {
			case x.IfAbsent && ok:
				return store.ErrKeyExists
			case x.IfModRevision != 0 && !ok:
				return store.ErrNotFound
			case x.IfModRevision != 0 && cur.ModRevision != x.IfModRevision:
				return store.ErrConflict
			case x.Kind == store.OpPut && x.Lease != store.NoLease && !m.alive[x.Lease]:
				return errLease
			}
			if x.Kind == store.OpPut {
				put(x.Key, x.Value, x.Lease)
			} else if ok {
				del(x.Key)
			}
		}
	case "endlease":
		for _, k := range slices.Sorted(maps.Keys(m.kvs)) {
			if o.lease != store.NoLease && m.kvs[k].Lease == o.lease {
				del(k)
			}
		}
	}
	if len(evs) == 0 {
		return nil
	}
	m.rev = next
	for _, e := range evs {
		if e.Type == store.EventDelete {
			delete(m.kvs, e.KV.Key)
		} else {
			m.kvs[e.KV.Key] = e.KV
		}
	}
	m.events = append(m.events, evs...)
	return nil
}

// list returns the model's keys under prefix, sorted.
func (m *model) list(prefix string) []store.KeyValue {
	var out []store.KeyValue
	for _, k := range slices.Sorted(maps.Keys(m.kvs)) {
		if strings.HasPrefix(k, prefix) {
			out = append(out, m.kvs[k])
		}
	}
	return out
}

// since returns the model's events under prefix from revision from on.
func (m *model) since(prefix string, from int64) []store.Event {
	var out []store.Event
	for _, e := range m.events {
		if e.KV.ModRevision >= from && strings.HasPrefix(e.KV.Key, prefix) {
			out = append(out, e)
		}
	}
	return out
}
