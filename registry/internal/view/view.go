package view

import (
	"cmp"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/google/btree"
)

// btreeDegree is the degree of the view's B-tree.
const btreeDegree = 16

// The log's allowance: the changes a view keeps for watchers to catch up
// from. It is bounded twice, and Trim keeps the fewer changes of the two:
// at most max(MinLogLen, items) changes, and replaced or removed items
// (the memory only the log holds) weighing at most max(MinLogBytes, what
// the current items weigh) — one full turnover of the state either way.
// An item can weigh a few hundred bytes or, with large metadata, half a
// megabyte, so the bound in bytes is the one on memory.
const (
	MinLogLen   = 4096
	MinLogBytes = 2 << 20
)

// Item is one instance in a view. Items are immutable once in a view.
type Item struct {
	Key  string
	Inst beacon.Instance
	// Rev is the revision of the item's last change: an Added event of a
	// snapshot or a tree walk carries it.
	Rev int64
	// Create and Mod are the store's create and mod revisions of the
	// instance's value (0 where the source has none): they tell a
	// re-listed key unchanged. Rev differs from Mod when the item changed
	// without its value (the registry joins health verdicts stored apart).
	Create int64
	Mod    int64
	// Lease and TTL are read by the registry's removal hold: the key's
	// lease (store.NoLease where unknown) and the lease TTL its value
	// declares (0: none).
	Lease store.LeaseID
	TTL   time.Duration
}

func itemLess(a, b *Item) bool { return a.Key < b.Key }

// Change is one entry of a view's log.
type Change struct {
	Seq    uint64
	Rev    int64
	Key    string
	Before *Item // nil: absent before the change
	After  *Item // nil: absent after it
	// Late: a removal delivered at a revision watchers had already been
	// given (see Deliver), so that one resuming from it gets it too.
	Late bool

	beforeWeight int64 // Before's weight, counted in the log's
}

// itemOverhead and mapEntryOverhead are what an item and an entry of its
// metadata weigh besides their strings' bytes.
const (
	itemOverhead     = int64(unsafe.Sizeof(Item{}))
	mapEntryOverhead = 48
)

// weight is about what the item holds in memory: itself, its strings, its
// metadata and its check and health, if any.
func (it *Item) weight() int64 {
	in := &it.Inst
	n := itemOverhead + int64(len(it.Key)+len(in.Namespace)+len(in.Component)+len(in.Endpoint)+
		len(in.ID)+len(in.Address)+len(in.Transport)+len(in.Status))
	n += int64(beacon.MetadataSize(in.Metadata) + mapEntryOverhead*len(in.Metadata))
	if c := in.Check; c != nil {
		n += int64(unsafe.Sizeof(*c)) + int64(len(c.Path)+len(c.Service))
	}
	if h := in.Health; h != nil {
		n += int64(unsafe.Sizeof(*h)) + int64(len(h.Reason)+len(h.Checker))
	}
	return n
}

// Version is an immutable copy of a view's state.
type Version struct {
	tree    *btree.BTreeG[*Item]
	Seq     uint64 // the last change in it
	Rev     int64  // the revision it is at
	Relists uint64 // re-listings it includes
}

// Get returns the item at key.
func (v *Version) Get(key string) (*Item, bool) { return v.tree.Get(&Item{Key: key}) }

// Len returns the number of items.
func (v *Version) Len() int { return v.tree.Len() }

// Ascend calls fn for each item in key order until it returns false.
func (v *Version) Ascend(fn func(*Item) bool) { v.tree.Ascend(fn) }

// View is the current state (a copy-on-write B-tree of items), the
// revision it is at, and a bounded log of its recent changes. It has no
// lock: its owner's mutex guards it (Rev, Seq, Relists, Len, Get, Since,
// After and Given only read, or Given atomically, so that an owner may
// call them under a read lock; Version may make a version: a write). Versions it hands out are immutable
// and may be read without that lock.
type View struct {
	tree      *btree.BTreeG[*Item]
	treeBytes int64 // the items' weight
	rev       int64
	seq       uint64
	log       []Change // changes floorSeq+1 .. seq
	logBytes  int64    // the weight of the log's Before items
	floorSeq  uint64   // every change after it is in log
	floorRev  int64    // every change at a revision above it is in log
	snap      *Version // cached version at (seq, rev, relists)
	relists   uint64
	given     atomic.Int64 // highest revision a batch was given at (Given)
}

// New returns an empty view at revision 0.
func New() *View {
	return &View{tree: btree.NewG(btreeDegree, itemLess)}
}

// Rev returns the revision the view is at.
func (v *View) Rev() int64 { return v.rev }

// Seq returns the sequence number of its last change.
func (v *View) Seq() uint64 { return v.seq }

// Relists returns the number of re-listings it went through.
func (v *View) Relists() uint64 { return v.relists }

// Len returns the number of items.
func (v *View) Len() int { return v.tree.Len() }

// Get returns the item at key.
func (v *View) Get(key string) (*Item, bool) { return v.tree.Get(&Item{Key: key}) }

// Ascend calls fn for each item in key order until it returns false.
func (v *View) Ascend(fn func(*Item) bool) { v.tree.Ascend(fn) }

// Load installs the first listing at rev, logging nothing: nobody has
// seen an earlier state.
func (v *View) Load(items []*Item, rev int64) {
	for _, it := range items {
		v.put(it)
	}
	v.rev, v.floorRev = rev, rev
}

// SetRev moves the view to revision rev (the revision of the changes just
// applied, or a listing's).
func (v *View) SetRev(rev int64) { v.rev = rev }

// Set installs it and logs the change at rev, unless the item it replaces
// holds an equal instance (then watchers have nothing to learn; the item
// is replaced all the same). It reports whether it logged a change.
func (v *View) Set(it *Item, rev int64) (old *Item, logged bool) {
	old = v.put(it)
	if old != nil && old.Inst.Equal(it.Inst) {
		return old, false
	}
	v.append(Change{Rev: rev, Key: it.Key, Before: old, After: it})
	return old, true
}

// Delete removes it and logs the removal at rev. It is a no-op unless it
// is the item the view holds at its key.
func (v *View) Delete(it *Item, rev int64) bool {
	if cur, ok := v.tree.Get(it); !ok || cur != it {
		return false
	}
	v.remove(it)
	v.append(Change{Rev: rev, Key: it.Key, Before: it})
	return true
}

// Deliver removes it at the current revision, outside any store event (a
// removal held back): if a batch was given at that revision already, the
// change is marked Late so that a watcher resuming from it gets it too.
func (v *View) Deliver(it *Item) bool {
	if cur, ok := v.tree.Get(it); !ok || cur != it {
		return false
	}
	v.remove(it)
	v.append(Change{Rev: v.rev, Key: it.Key, Before: it, Late: v.given.Load() >= v.rev})
	return true
}

// Amend replaces the item at it.Key with it at the current revision,
// outside any store event (a change its owner derives, such as a health
// panic that a removal delivered late ends): like Deliver, the change is
// Late if a batch was given at that revision already. It logs nothing if
// the instance is unchanged (the item is replaced all the same), and is a
// no-op if the view holds nothing at that key. It reports whether it
// logged a change.
func (v *View) Amend(it *Item) bool {
	if _, ok := v.tree.Get(it); !ok {
		return false
	}
	cur := v.put(it)
	if cur.Inst.Equal(it.Inst) {
		return false
	}
	v.append(Change{Rev: v.rev, Key: it.Key, Before: cur, After: it, Late: v.given.Load() >= v.rev})
	return true
}

// Given records that a batch is given at rev. Unlike the other methods it
// may run under the owner's read lock, concurrently with other Given
// calls: a writer's Deliver or Amend (under the write lock) sees every
// Given of a reader that held the lock before it.
func (v *View) Given(rev int64) {
	for {
		g := v.given.Load()
		if g >= rev || v.given.CompareAndSwap(g, rev) {
			return
		}
	}
}

// Relisted counts a re-listing: watchers get their next batch as a Resync.
func (v *View) Relisted() { v.relists++ }

// Rebase forgets the log: the revision went back to rev (a store restored
// from a backup), and no watcher can resume from an earlier one.
func (v *View) Rebase(rev int64) {
	v.log, v.logBytes, v.floorSeq, v.floorRev = nil, 0, v.seq, rev
}

// put installs it in the tree and returns the item it replaces, if any.
func (v *View) put(it *Item) (old *Item) {
	old, _ = v.tree.ReplaceOrInsert(it)
	v.treeBytes += it.weight()
	if old != nil {
		v.treeBytes -= old.weight()
	}
	return old
}

// remove takes it out of the tree.
func (v *View) remove(it *Item) {
	v.tree.Delete(it)
	v.treeBytes -= it.weight()
}

func (v *View) append(c Change) {
	v.seq++
	c.Seq = v.seq
	if c.Before != nil {
		c.beforeWeight = c.Before.weight()
		v.logBytes += c.beforeWeight
	}
	v.log = append(v.log, c)
}

// Trim keeps the log within twice its allowance (see MinLogLen): past
// that in changes or in bytes, it drops the oldest changes down to the
// allowance (amortised O(1) per change).
func (v *View) Trim() {
	keepN, keepB := max(MinLogLen, v.tree.Len()), max(MinLogBytes, v.treeBytes)
	if len(v.log) <= 2*keepN && v.logBytes <= 2*keepB {
		return
	}
	drop, bytes := 0, v.logBytes
	for drop < len(v.log) && (len(v.log)-drop > keepN || bytes > keepB) {
		bytes -= v.log[drop].beforeWeight
		drop++
	}
	v.floorSeq = v.log[drop-1].Seq
	v.floorRev = max(v.floorRev, v.log[drop-1].Rev)
	v.log, v.logBytes = slices.Clone(v.log[drop:]), bytes
}

// Version returns an immutable copy of the current state (cached until
// the state changes).
func (v *View) Version() *Version {
	if v.snap == nil || v.snap.Seq != v.seq || v.snap.Rev != v.rev || v.snap.Relists != v.relists {
		v.snap = &Version{tree: v.tree.Clone(), Seq: v.seq, Rev: v.rev, Relists: v.relists}
	}
	return v.snap
}

// Since returns the log entries after seq, or false if some were trimmed.
// The returned slice is never modified afterwards.
func (v *View) Since(seq uint64) ([]Change, bool) {
	if seq < v.floorSeq {
		return nil, false
	}
	i := int(seq - v.floorSeq)
	return v.log[i:len(v.log):len(v.log)], true
}

// After returns the log entries a watcher resuming from revision rev has
// not seen: every change at a later revision, and the Late ones at rev;
// false if the log no longer covers rev (or rev is beyond the view's).
// The returned slice is never modified afterwards.
func (v *View) After(rev int64) ([]Change, bool) {
	if rev <= 0 || rev < v.floorRev || rev > v.rev {
		return nil, false
	}
	i, _ := slices.BinarySearchFunc(v.log, rev, func(c Change, rev int64) int { return cmp.Compare(c.Rev, rev) })
	for i < len(v.log) && v.log[i].Rev == rev && !v.log[i].Late {
		i++
	}
	return v.log[i:len(v.log):len(v.log)], true
}
