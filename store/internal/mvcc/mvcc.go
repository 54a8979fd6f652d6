package mvcc

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/beaconplane/beacon/store"
	"github.com/google/btree"
)

// Config configures a Store. The zero value keeps every revision until
// Compact and accepts every lease.
type Config struct {
	// History is how many of the most recent revisions the event log keeps:
	// after each commit, older revisions are compacted. Zero (or negative)
	// sets no bound in revisions.
	History int64
	// HistoryBytes bounds the event log by size as History bounds it by
	// revisions: after each commit, the oldest revisions are compacted until
	// the log's events weigh at most HistoryBytes (EventSize each), except
	// that the current revision is always kept whole, however large. A
	// revision can hold many events (a transaction, the end of a lease), so
	// this is the bound on memory. Zero (or negative) sets no bound in size.
	HistoryBytes int64
	// LeaseAlive tells whether a write may bind a key to the lease (never
	// store.NoLease): nil, or an error matching store.ErrLeaseNotFound that
	// the write returns. It runs with the Store's lock held, so it must not
	// call the Store. Nil accepts every lease.
	LeaseAlive func(store.LeaseID) error
}

// Store is the in-memory state of a key space: keys, revisions, the event
// log, watchers and the keys of each lease. See the package documentation.
// It starts empty at revision 1. Its methods are safe for concurrent use.
type Store struct {
	history      int64
	historyBytes int64
	leaseAlive   func(store.LeaseID) error

	mu      sync.Mutex
	rev     int64 // the current revision
	compact int64 // the oldest revision still in the log
	data    *btree.BTreeG[*store.KeyValue]
	log     []store.Event                         // every event with revision >= compact, in order
	logSize int64                                 // the EventSize of log's events
	leases  map[store.LeaseID]map[string]struct{} // lease → the keys bound to it (only leases with keys)
	changed chan struct{}                         // closed and replaced at every change
	closed  bool
	scratch txn // Commit's, reused under mu
	// epoch counts Resets; a watch started in an earlier epoch ends with
	// resetErr, since its revisions no longer name the same history.
	epoch    uint64
	resetErr error

	done      chan struct{} // closed by Close
	watchers  sync.WaitGroup
	closeOnce sync.Once
}

// New returns an empty Store at revision 1.
func New(opts Config) *Store {
	return &Store{
		history:      opts.History,
		historyBytes: opts.HistoryBytes,
		leaseAlive:   opts.LeaseAlive,
		rev:          1,
		compact:      1,
		data:         btree.NewG(32, func(a, b *store.KeyValue) bool { return a.Key < b.Key }),
		leases:       make(map[store.LeaseID]map[string]struct{}),
		changed:      make(chan struct{}),
		done:         make(chan struct{}),
	}
}

// eventOverhead is what an event weighs in the log besides its key's and
// value's bytes.
const eventOverhead = int64(unsafe.Sizeof(store.Event{}))

// EventSize is what an event weighs against Config.HistoryBytes: its key,
// its value and the event itself as the log holds it.
func EventSize(e store.Event) int64 {
	return int64(len(e.KV.Key)+len(e.KV.Value)) + eventOverhead
}

// appendLogLocked adds events to the log and to its size.
func (s *Store) appendLogLocked(events []store.Event) {
	s.log = append(s.log, events...)
	for _, e := range events {
		s.logSize += EventSize(e)
	}
}

// Close ends every watch (their channels close without an error) and waits
// for their goroutines; every later call fails with store.ErrClosed. It is
// idempotent.
func (s *Store) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.done)
		close(s.changed)
		s.mu.Unlock()
	})
	s.watchers.Wait()
}

// Done is closed by Close.
func (s *Store) Done() <-chan struct{} { return s.done }

// Closed reports whether Close was called.
func (s *Store) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Usable returns ctx's error, or store.ErrClosed after Close, or nil.
func (s *Store) Usable(ctx context.Context) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// lock locks the Store for an operation, checking ctx and Close first.
func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	return nil
}

// Get implements store.Reader.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.KeyValue{}, err
	}
	if err := s.lock(ctx); err != nil {
		return store.KeyValue{}, err
	}
	defer s.mu.Unlock()
	kv := s.get(key)
	if kv == nil {
		return store.KeyValue{}, fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	return cloneKV(kv), nil
}

// List implements store.Reader.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, 0, err
	}
	if err := s.lock(ctx); err != nil {
		return nil, 0, err
	}
	defer s.mu.Unlock()
	var out []store.KeyValue
	s.data.AscendGreaterOrEqual(&store.KeyValue{Key: prefix}, func(kv *store.KeyValue) bool {
		if !strings.HasPrefix(kv.Key, prefix) {
			return false
		}
		out = append(out, cloneKV(kv))
		return true
	})
	return out, s.rev, nil
}

func (s *Store) get(key string) *store.KeyValue {
	kv, _ := s.data.Get(&store.KeyValue{Key: key})
	return kv
}

// Revisions returns the compaction watermark (the oldest revision a watch
// may start from) and the current revision.
func (s *Store) Revisions() (compact, current int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.compact, s.rev
}

// Commit checks c against the current state and, if it changes anything,
// applies it as the next revision, all under one lock hold. It returns the
// new revision, or the current one when c changes nothing.
func (s *Store) Commit(ctx context.Context, c Change) (int64, error) {
	if err := c.err; err != nil {
		return 0, err
	}
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	t := &s.scratch
	*t = txn{s: s, rev: s.rev + 1, events: t.events[:0]}
	defer t.reset()
	if err := t.build(c); err != nil {
		return 0, err
	}
	if len(t.events) > 0 {
		s.applyLocked(t.rev, t.events)
	}
	return s.rev, nil
}

// reset drops the events' values, and a buffer grown by a large change.
func (t *txn) reset() {
	clear(t.events)
	if cap(t.events) > 64 {
		t.events = nil
	}
	t.events = t.events[:0]
}

// Batch is the outcome of Prepare: the events of revision Rev, or, when
// Events is empty, nothing to write at the current revision Rev.
type Batch struct {
	Rev    int64
	Events []store.Event
}

// Prepare checks c against the current state and returns the events it
// makes, without applying them: the caller makes them durable, then hands
// them to Apply. Nothing else may change the Store in between (the file
// backend holds its write lock throughout).
func (s *Store) Prepare(c Change) (Batch, error) {
	if err := c.err; err != nil {
		return Batch{}, err
	}
	if err := s.lock(context.Background()); err != nil {
		return Batch{}, err
	}
	defer s.mu.Unlock()
	t := txn{s: s, rev: s.rev + 1}
	if err := t.build(c); err != nil {
		return Batch{}, err
	}
	if len(t.events) == 0 {
		return Batch{Rev: s.rev}, nil
	}
	return Batch{Rev: t.rev, Events: t.events}, nil
}

// Apply applies the events of revision rev, as Prepare made them or as a
// log holds them (each event's ModRevision is rev). The next revision
// changes the state. A revision the state already holds (a log replayed
// over the snapshot it was loaded from) only adds to the history, if it is
// not below the watermark. Any later revision is a gap: an error.
func (s *Store) Apply(rev int64, events []store.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case rev <= s.rev:
		if rev >= s.compact {
			s.appendLogLocked(events)
		}
		return nil
	case rev != s.rev+1:
		return fmt.Errorf("revision %d follows revision %d", rev, s.rev)
	}
	s.applyLocked(rev, events)
	return nil
}

// applyLocked makes rev the current revision: it applies the events to the
// keys and their leases, logs them, wakes the watchers and trims the
// history to its window.
func (s *Store) applyLocked(rev int64, events []store.Event) {
	s.rev = rev
	for _, e := range events {
		if e.Type == store.EventDelete {
			if old, ok := s.data.Delete(&store.KeyValue{Key: e.KV.Key}); ok {
				s.unbind(old)
			}
			continue
		}
		kv := e.KV
		old, ok := s.data.ReplaceOrInsert(&kv)
		if ok && old.Lease == kv.Lease {
			continue // bound to the same lease already
		}
		if ok {
			s.unbind(old)
		}
		s.bind(&kv)
	}
	s.appendLogLocked(events)
	s.notifyLocked()
	if w := s.windowLocked(s.history, s.historyBytes); w > s.compact {
		s.compactLocked(w)
	}
}

// Window returns the watermark that would leave at most revs revisions and
// bytes of events (EventSize) in the log — the current watermark if the log
// is within both — never past the current revision, which is kept whole
// whatever its size. A bound of zero or less is no bound. A backend that
// compacts by its own records (file) asks it where to compact to.
func (s *Store) Window(revs, bytes int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.windowLocked(revs, bytes)
}

// HistorySize returns how many revisions the log holds (from the watermark
// to the current revision) and what its events weigh (EventSize).
func (s *Store) HistorySize() (revs, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev - s.compact + 1, s.logSize
}

func (s *Store) windowLocked(revs, bytes int64) int64 {
	w := s.compact
	if revs > 0 && s.rev-w >= revs {
		w = s.rev - revs + 1
	}
	if bytes <= 0 || s.logSize <= bytes {
		return w
	}
	// Drop the oldest events until the rest fit, then the rest of the
	// revision the last one dropped belongs to: a revision goes whole.
	excess, i := s.logSize-bytes, 0
	for ; i < len(s.log) && excess > 0; i++ {
		excess -= EventSize(s.log[i])
	}
	if i == 0 {
		return w
	}
	return max(w, min(s.log[i-1].KV.ModRevision+1, s.rev))
}

func (s *Store) notifyLocked() {
	if s.closed {
		return // Close closed the channel
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// Install replaces the whole state with a snapshot's: the keys kvs (in any
// order) at revision rev, with an empty history compacted to compact.
// Watchers wake, and those behind compact end with a *store.CompactedError.
func (s *Store) Install(rev, compact int64, kvs []store.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data.Clear(false)
	clear(s.leases)
	for i := range kvs {
		kv := kvs[i]
		s.data.ReplaceOrInsert(&kv)
		s.bind(&kv)
	}
	s.rev, s.compact, s.log, s.logSize = rev, compact, nil, 0
	s.notifyLocked()
}

// Reset empties the state (revision 1, as New) and ends every watch
// started before it with err: for a backend whose key space was replaced
// by another one (the file store's directory, replaced under a live
// process), where revisions start again and a watcher's next revision
// means nothing in the new history. Watchers must re-list.
func (s *Store) Reset(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data.Clear(false)
	clear(s.leases)
	s.rev, s.compact, s.log, s.logSize = 1, 1, nil, 0
	s.epoch++
	s.resetErr = err
	s.notifyLocked()
}

// Snapshot returns the current revision, the watermark and every key, in
// key order. The values are shared with the Store: read them only.
func (s *Store) Snapshot() (rev, compact int64, kvs []store.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kvs = make([]store.KeyValue, 0, s.data.Len())
	s.data.Ascend(func(kv *store.KeyValue) bool {
		kvs = append(kvs, *kv)
		return true
	})
	return s.rev, s.compact, kvs
}

// CheckCompact refuses a compaction to rev: past the current revision (an
// error), or not above the watermark (a *store.CompactedError).
func (s *Store) CheckCompact(rev int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkCompactLocked(rev)
}

func (s *Store) checkCompactLocked(rev int64) error {
	switch {
	case rev > s.rev:
		return fmt.Errorf("store: cannot compact to revision %d: the current revision is %d", rev, s.rev)
	case rev <= s.compact:
		return &store.CompactedError{Requested: rev, CompactRevision: s.compact}
	}
	return nil
}

// Compact implements store.Compactor: it checks rev (CheckCompact), then
// drops the history below it.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.checkCompactLocked(rev); err != nil {
		return err
	}
	s.compactLocked(rev)
	return nil
}

// CompactTo raises the watermark to w, as a log's compaction record does:
// never past the next revision, never down.
func (s *Store) CompactTo(w int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w = min(w, s.rev+1); w > s.compact {
		s.compactLocked(w)
	}
}

// compactLocked drops the events below rev. A watcher that needed them
// finds out when it next reads the log (one waiting for news is never
// behind the watermark: a watermark is at most the current revision). The
// log is copied only when at least half of it goes, so trimming costs O(1)
// amortised per write; otherwise the dropped events are cleared, so that
// their keys and values are freed at once, not when the log next grows.
func (s *Store) compactLocked(rev int64) {
	s.compact = rev
	i := sort.Search(len(s.log), func(i int) bool { return s.log[i].KV.ModRevision >= rev })
	for _, e := range s.log[:i] {
		s.logSize -= EventSize(e)
	}
	if i >= len(s.log)/2 {
		s.log = slices.Clone(s.log[i:])
		return
	}
	clear(s.log[:i])
	s.log = s.log[i:]
}

// checkLease asks the backend whether a write may bind key to the lease.
func (s *Store) checkLease(id store.LeaseID) error {
	if id == store.NoLease || s.leaseAlive == nil {
		return nil
	}
	return s.leaseAlive(id)
}

func (s *Store) bind(kv *store.KeyValue) {
	if kv.Lease == store.NoLease {
		return
	}
	m := s.leases[kv.Lease]
	if m == nil {
		m = make(map[string]struct{})
		s.leases[kv.Lease] = m
	}
	m[kv.Key] = struct{}{}
}

func (s *Store) unbind(kv *store.KeyValue) {
	if m := s.leases[kv.Lease]; m != nil {
		delete(m, kv.Key)
		if len(m) == 0 {
			delete(s.leases, kv.Lease)
		}
	}
}

// leaseKeys returns the keys bound to the lease, sorted.
func (s *Store) leaseKeys(id store.LeaseID) []string {
	m := s.leases[id]
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ForEachLease calls fn with every lease that has keys bound to it, under
// the Store's lock: fn must not call the Store.
func (s *Store) ForEachLease(fn func(store.LeaseID)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.leases {
		fn(id)
	}
}

// HasKeys reports whether any key is bound to the lease.
func (s *Store) HasKeys(id store.LeaseID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases[id]) > 0
}

func cloneKV(kv *store.KeyValue) store.KeyValue {
	c := *kv
	if kv.Value != nil {
		c.Value = bytes.Clone(kv.Value)
	}
	return c
}
