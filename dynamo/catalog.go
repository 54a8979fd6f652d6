package dynamo

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/beaconplane/beacon"
)

// Catalog is the state of a set of decoded entries, as Beacon serves it:
// each instance with the model names of its cards joined (MetaModels), and
// no instance whose Beacon ref another instance entry also maps to. S is
// what the caller keeps with each entry (store revisions and lease, say).
// A Catalog is not safe for concurrent use.
type Catalog[S any] struct {
	entries map[string]stored[S]    // by entry key
	refs    map[beacon.Ref]*refKeys // the keys of each ref's entries
}

type stored[S any] struct {
	e   Entry
	src S
}

// refKeys are the keys of one ref's entries, each list sorted.
type refKeys struct {
	endpoints []string
	models    []string
}

// NewCatalog returns an empty catalog.
func NewCatalog[S any]() *Catalog[S] {
	return &Catalog[S]{entries: make(map[string]stored[S]), refs: make(map[beacon.Ref]*refKeys)}
}

// Served is an instance as a Catalog serves it.
type Served[S any] struct {
	// Instance is the entry's instance with MetaModels joined.
	Instance beacon.Instance
	// Key and Source are the instance entry's.
	Key    string
	Source S
	// Models are the model cards joined, by key.
	Models []ModelCard[S]
}

// ModelCard is one model card of an instance.
type ModelCard[S any] struct {
	Key    string
	Model  string
	Source S
}

// Put records e, decoded from the key e.Key, with src, replacing what the
// key held. It returns the ref whose served instance may have changed.
func (c *Catalog[S]) Put(e Entry, src S) beacon.Ref {
	ref := e.Parsed.Ref()
	if _, ok := c.entries[e.Key]; !ok {
		rk := c.refs[ref]
		if rk == nil {
			rk = &refKeys{}
			c.refs[ref] = rk
		}
		list := &rk.endpoints
		if e.Parsed.Kind == KindModel {
			list = &rk.models
		}
		i, _ := slices.BinarySearch(*list, e.Key)
		*list = slices.Insert(*list, i, e.Key)
	}
	c.entries[e.Key] = stored[S]{e: e, src: src}
	return ref
}

// Delete forgets the entry at key. It returns the ref whose served
// instance may have changed, and false if the catalog held no entry there.
func (c *Catalog[S]) Delete(key string) (beacon.Ref, bool) {
	s, ok := c.entries[key]
	if !ok {
		return beacon.Ref{}, false
	}
	delete(c.entries, key)
	ref := s.e.Parsed.Ref()
	rk := c.refs[ref]
	list := &rk.endpoints
	if s.e.Parsed.Kind == KindModel {
		list = &rk.models
	}
	if i, found := slices.BinarySearch(*list, key); found {
		*list = slices.Delete(*list, i, i+1)
	}
	if len(rk.endpoints) == 0 && len(rk.models) == 0 {
		delete(c.refs, ref)
	}
	return ref, true
}

// Get returns the entry at key and its source.
func (c *Catalog[S]) Get(key string) (Entry, S, bool) {
	s, ok := c.entries[key]
	return s.e, s.src, ok
}

// Lookup returns the instance the catalog serves at ref: false when no
// instance entry maps to it, or more than one does (Colliding).
func (c *Catalog[S]) Lookup(ref beacon.Ref) (Served[S], bool) {
	rk := c.refs[ref]
	if rk == nil || len(rk.endpoints) != 1 {
		return Served[S]{}, false
	}
	s := c.entries[rk.endpoints[0]]
	out := Served[S]{Instance: s.e.Instance.Clone(), Key: s.e.Key, Source: s.src}
	var names []string
	for _, key := range rk.models {
		m := c.entries[key]
		out.Models = append(out.Models, ModelCard[S]{Key: key, Model: m.e.Model, Source: m.src})
		names = append(names, m.e.Model)
	}
	slices.Sort(names)
	if names = slices.Compact(names); len(names) > 0 {
		out.Instance.Metadata[MetaModels] = strings.Join(names, ",")
	}
	return out, true
}

// Colliding returns the keys of the instance entries that map to ref,
// sorted, when there are more than one (a padded and an unpadded ID of one
// instance): none of them is served. Nil otherwise.
func (c *Catalog[S]) Colliding(ref beacon.Ref) []string {
	rk := c.refs[ref]
	if rk == nil || len(rk.endpoints) < 2 {
		return nil
	}
	return slices.Clone(rk.endpoints)
}

// Models returns the model cards stored for ref, whether or not an
// instance is served there.
func (c *Catalog[S]) Models(ref beacon.Ref) []ModelCard[S] {
	rk := c.refs[ref]
	if rk == nil {
		return nil
	}
	out := make([]ModelCard[S], 0, len(rk.models))
	for _, key := range rk.models {
		m := c.entries[key]
		out = append(out, ModelCard[S]{Key: key, Model: m.e.Model, Source: m.src})
	}
	return out
}

// Refs returns every ref some instance entry maps to (served or
// colliding), sorted by namespace, component, endpoint and ID.
func (c *Catalog[S]) Refs() []beacon.Ref {
	out := make([]beacon.Ref, 0, len(c.refs))
	for ref, rk := range c.refs {
		if len(rk.endpoints) > 0 {
			out = append(out, ref)
		}
	}
	slices.SortFunc(out, compareRefs)
	return out
}

// Keys returns the key of every entry, sorted.
func (c *Catalog[S]) Keys() []string {
	return slices.Sorted(maps.Keys(c.entries))
}

func compareRefs(a, b beacon.Ref) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Component, b.Component),
		cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.ID, b.ID))
}
