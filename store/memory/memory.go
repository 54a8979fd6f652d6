package memory

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/google/btree"
)

// DefaultHistory is the number of revisions a store keeps for watches to
// resume from when Options.History is zero.
const DefaultHistory = 100_000

// maxBatch bounds the events of one watch response (a revision is never
// split, so a response may exceed it by one revision's events).
const maxBatch = 1000

// Options configure a memory store. The zero value is ready to use.
type Options struct {
	// History is how many of the most recent revisions watches can start
	// from; older revisions are compacted automatically. Zero means
	// DefaultHistory; negative means keep everything until Compact.
	History int
}

// Store is an in-memory store.Store. Create it with New; Close it to stop its
// goroutines.
type Store struct {
	history int

	mu       sync.Mutex
	rev      int64 // current revision
	compact  int64 // oldest revision still in the event log
	data     *btree.BTreeG[*store.KeyValue]
	log      []store.Event // every event with revision >= compact, in order
	leases   map[store.LeaseID]*lease
	expiry   leaseHeap
	lastID   store.LeaseID
	changed  chan struct{} // closed and replaced at every commit
	closed   bool
	done     chan struct{}
	kick     chan struct{} // wakes the expiry loop when the earliest deadline moves
	wg       sync.WaitGroup
	closeErr sync.Once
}

var (
	_ store.Store      = (*Store)(nil)
	_ store.Compactor  = (*Store)(nil)
	_ store.Transactor = (*Store)(nil)
)

type lease struct {
	id       store.LeaseID
	ttl      time.Duration
	deadline time.Time
	keys     map[string]struct{}
}

// New returns an empty store at revision 1, with its lease expiry goroutine
// running.
func New(opts Options) *Store {
	h := opts.History
	if h == 0 {
		h = DefaultHistory
	}
	s := &Store{
		history: h,
		rev:     1,
		compact: 1,
		data: btree.NewG(32, func(a, b *store.KeyValue) bool {
			return a.Key < b.Key
		}),
		leases:  make(map[store.LeaseID]*lease),
		changed: make(chan struct{}),
		done:    make(chan struct{}),
		kick:    make(chan struct{}, 1),
	}
	s.wg.Add(1)
	go s.expireLoop()
	return s
}

// Close stops the store: its expiry loop and every watch end (watch channels
// close), and every later call fails with store.ErrClosed. Close is
// idempotent.
func (s *Store) Close() error {
	s.closeErr.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.done)
		close(s.changed)
		s.mu.Unlock()
	})
	s.wg.Wait()
	return nil
}

// begin locks the store for an operation, checking ctx and Close.
func (s *Store) begin(ctx context.Context) error {
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
	if err := s.begin(ctx); err != nil {
		return store.KeyValue{}, err
	}
	defer s.mu.Unlock()
	kv, ok := s.data.Get(&store.KeyValue{Key: key})
	if !ok {
		return store.KeyValue{}, fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	return cloneKV(kv), nil
}

// List implements store.Reader.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, 0, err
	}
	if err := s.begin(ctx); err != nil {
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

// Create implements store.Writer.
func (s *Store) Create(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, key, value, store.ApplyWriteOptions(opts), func(old *store.KeyValue) error {
		if old != nil {
			return fmt.Errorf("%w: %q (created at revision %d)", store.ErrKeyExists, key, old.CreateRevision)
		}
		return nil
	})
}

// Put implements store.Writer.
func (s *Store) Put(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, key, value, store.ApplyWriteOptions(opts), func(*store.KeyValue) error { return nil })
}

// Update implements store.Writer.
func (s *Store) Update(ctx context.Context, key string, value []byte, modRevision int64, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, key, value, store.ApplyWriteOptions(opts), func(old *store.KeyValue) error {
		return checkModRevision(key, old, modRevision)
	})
}

func checkModRevision(key string, old *store.KeyValue, want int64) error {
	if old == nil {
		return fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	if old.ModRevision != want {
		return fmt.Errorf("%w: %q was written at revision %d, not %d", store.ErrConflict, key, old.ModRevision, want)
	}
	return nil
}

func (s *Store) write(ctx context.Context, key string, value []byte, o store.WriteOptions, check func(*store.KeyValue) error) (int64, error) {
	if err := store.ValidateWrite(key, value); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	old, _ := s.data.Get(&store.KeyValue{Key: key})
	if err := check(old); err != nil {
		return 0, err
	}
	if o.KeepLease {
		if old == nil {
			return 0, fmt.Errorf("%w: %q (keeping its lease needs the key)", store.ErrNotFound, key)
		}
		o.Lease = old.Lease
	}
	if o.Lease != store.NoLease && s.leases[o.Lease] == nil {
		return 0, fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, o.Lease)
	}
	s.rev++
	s.putLocked(key, value, o.Lease)
	s.commitLocked()
	return s.rev, nil
}

// putLocked writes key at s.rev and logs the event.
func (s *Store) putLocked(key string, value []byte, leaseID store.LeaseID) {
	kv := &store.KeyValue{Key: key, Value: bytes.Clone(value), CreateRevision: s.rev, ModRevision: s.rev, Lease: leaseID}
	if kv.Value == nil {
		kv.Value = []byte{}
	}
	if old, ok := s.data.Get(kv); ok {
		kv.CreateRevision = old.CreateRevision
		if old.Lease != leaseID {
			s.detachLocked(old)
		}
	}
	if l := s.leases[leaseID]; l != nil {
		l.keys[key] = struct{}{}
	}
	s.data.ReplaceOrInsert(kv)
	s.log = append(s.log, store.Event{Type: store.EventPut, KV: *kv})
}

// deleteLocked removes key at s.rev and logs the event.
func (s *Store) deleteLocked(kv *store.KeyValue) {
	s.detachLocked(kv)
	s.data.Delete(kv)
	s.log = append(s.log, store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: kv.Key, ModRevision: s.rev}})
}

func (s *Store) detachLocked(kv *store.KeyValue) {
	if l := s.leases[kv.Lease]; l != nil {
		delete(l.keys, kv.Key)
	}
}

// commitLocked wakes watchers and trims the history to its window.
func (s *Store) commitLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
	if s.history > 0 && s.rev-s.compact >= int64(s.history) {
		s.compactLocked(s.rev - int64(s.history) + 1)
	}
}

// compactLocked drops events below rev. The log is copied only when at
// least half of it goes, so trimming costs O(1) amortised per write.
func (s *Store) compactLocked(rev int64) {
	s.compact = rev
	i := sort.Search(len(s.log), func(i int) bool { return s.log[i].KV.ModRevision >= rev })
	if i >= len(s.log)/2 {
		s.log = slices.Clone(s.log[i:])
	} else {
		s.log = s.log[i:]
	}
}

// Delete implements store.Writer.
func (s *Store) Delete(ctx context.Context, key string, opts ...store.DeleteOption) (int64, error) {
	if err := store.ValidateKey(key); err != nil {
		return 0, err
	}
	o := store.ApplyDeleteOptions(opts)
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	old, ok := s.data.Get(&store.KeyValue{Key: key})
	if !ok {
		return 0, fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	if o.IfModRevision != 0 {
		if err := checkModRevision(key, old, o.IfModRevision); err != nil {
			return 0, err
		}
	}
	s.rev++
	s.deleteLocked(old)
	s.commitLocked()
	return s.rev, nil
}

// Txn implements store.Transactor.
func (s *Store) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	if err := store.ValidateOps(ops); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	changes := false
	for _, op := range ops {
		old, exists := s.data.Get(&store.KeyValue{Key: op.Key})
		switch {
		case op.IfAbsent && exists:
			return 0, &store.ConflictError{Key: op.Key, Err: store.ErrKeyExists}
		case op.IfModRevision != 0 && !exists:
			return 0, &store.ConflictError{Key: op.Key, Err: store.ErrNotFound}
		case op.IfModRevision != 0 && old.ModRevision != op.IfModRevision:
			return 0, &store.ConflictError{Key: op.Key, Err: store.ErrConflict}
		}
		if op.Kind == store.OpPut && op.Lease != store.NoLease && s.leases[op.Lease] == nil {
			return 0, fmt.Errorf("%w: lease %x (for %q)", store.ErrLeaseNotFound, op.Lease, op.Key)
		}
		changes = changes || op.Kind == store.OpPut || exists
	}
	if !changes {
		return s.rev, nil
	}
	s.rev++
	for _, op := range ops {
		switch op.Kind {
		case store.OpPut:
			s.putLocked(op.Key, op.Value, op.Lease)
		case store.OpDelete:
			if old, ok := s.data.Get(&store.KeyValue{Key: op.Key}); ok {
				s.deleteLocked(old)
			}
		}
	}
	s.commitLocked()
	return s.rev, nil
}

// Compact implements store.Compactor: watches from revisions below rev
// fail with store.ErrCompacted afterwards.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	switch {
	case rev > s.rev:
		return fmt.Errorf("store: cannot compact to revision %d: the current revision is %d", rev, s.rev)
	case rev <= s.compact:
		return &store.CompactedError{Requested: rev, CompactRevision: s.compact}
	}
	s.compactLocked(rev)
	return nil
}

// Grant implements store.Leaser.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateTTL(ttl); err != nil {
		return store.Lease{}, err
	}
	if err := s.begin(ctx); err != nil {
		return store.Lease{}, err
	}
	defer s.mu.Unlock()
	s.lastID++
	l := &lease{id: s.lastID, ttl: ttl, deadline: time.Now().Add(ttl), keys: make(map[string]struct{})}
	s.leases[l.id] = l
	heap.Push(&s.expiry, expiryItem{at: l.deadline, id: l.id})
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return store.Lease{ID: l.id, TTL: ttl}, nil
}

// KeepAlive implements store.Leaser.
func (s *Store) KeepAlive(ctx context.Context, id store.LeaseID) (time.Duration, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return 0, fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
	}
	// The heap entry at the old deadline re-arms itself for the new one.
	l.deadline = time.Now().Add(l.ttl)
	return l.ttl, nil
}

// Revoke implements store.Leaser.
func (s *Store) Revoke(ctx context.Context, id store.LeaseID) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
	}
	s.endLeaseLocked(l)
	return nil
}

// endLeaseLocked deletes the lease and all its keys in one revision.
func (s *Store) endLeaseLocked(l *lease) {
	delete(s.leases, l.id)
	if len(l.keys) == 0 {
		return
	}
	keys := make([]string, 0, len(l.keys))
	for k := range l.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	s.rev++
	for _, k := range keys {
		if kv, ok := s.data.Get(&store.KeyValue{Key: k}); ok {
			s.deleteLocked(kv)
		}
	}
	s.commitLocked()
}

// expireLoop ends leases at their deadlines.
func (s *Store) expireLoop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		now := time.Now()
		for len(s.expiry) > 0 && !s.expiry[0].at.After(now) {
			it := heap.Pop(&s.expiry).(expiryItem)
			l := s.leases[it.id]
			switch {
			case l == nil: // revoked
			case l.deadline.After(now): // kept alive: wait for the new deadline
				heap.Push(&s.expiry, expiryItem{at: l.deadline, id: l.id})
			default:
				s.endLeaseLocked(l)
			}
		}
		wait := time.Hour
		if len(s.expiry) > 0 {
			wait = s.expiry[0].at.Sub(now)
		}
		s.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-s.done:
			return
		case <-timer.C:
		case <-s.kick:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
	}
}

// Watch implements store.Watcher.
func (s *Store) Watch(ctx context.Context, prefix string, fromRevision int64) store.WatchChan {
	ch := make(chan store.WatchResponse, 1)
	fail := func(err error) store.WatchChan {
		ch <- store.WatchResponse{Err: err}
		close(ch)
		return ch
	}
	if err := store.ValidatePrefix(prefix); err != nil {
		return fail(err)
	}
	if fromRevision < 0 {
		return fail(fmt.Errorf("store: watch from negative revision %d", fromRevision))
	}
	if err := s.begin(ctx); err != nil {
		return fail(err)
	}
	next := fromRevision
	if next == 0 {
		next = s.rev + 1
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go s.watch(ctx, ch, prefix, next)
	return ch
}

// watch feeds one watcher from the event log, starting at revision next.
func (s *Store) watch(ctx context.Context, ch chan<- store.WatchResponse, prefix string, next int64) {
	defer s.wg.Done()
	defer close(ch)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		if next < s.compact {
			err := &store.CompactedError{Requested: next, CompactRevision: s.compact}
			s.mu.Unlock()
			select {
			case ch <- store.WatchResponse{Err: err}:
			case <-ctx.Done():
			case <-s.done:
			}
			return
		}
		events, last := s.collectLocked(prefix, next)
		changed := s.changed
		s.mu.Unlock()
		if last == 0 { // nothing new yet
			select {
			case <-changed:
			case <-ctx.Done():
				return
			case <-s.done:
				return
			}
			continue
		}
		next = last + 1
		if len(events) == 0 {
			continue // only other prefixes changed
		}
		select {
		case ch <- store.WatchResponse{Events: events}:
		case <-ctx.Done():
			return
		case <-s.done:
			return
		}
	}
}

// collectLocked returns the events under prefix from revision next on, at
// most about maxBatch of them without splitting a revision, and the last
// revision it examined (0 if the log holds nothing at or after next).
func (s *Store) collectLocked(prefix string, next int64) ([]store.Event, int64) {
	i := sort.Search(len(s.log), func(i int) bool { return s.log[i].KV.ModRevision >= next })
	var out []store.Event
	var last int64
	for ; i < len(s.log); i++ {
		ev := s.log[i]
		if rev := ev.KV.ModRevision; rev != last {
			if len(out) >= maxBatch {
				break
			}
			last = rev
		}
		if strings.HasPrefix(ev.KV.Key, prefix) {
			ev.KV = cloneKV(&ev.KV)
			out = append(out, ev)
		}
	}
	return out, last
}

func cloneKV(kv *store.KeyValue) store.KeyValue {
	c := *kv
	if kv.Value != nil {
		c.Value = bytes.Clone(kv.Value)
	}
	return c
}

// expiryItem is a lease deadline in the expiry heap.
type expiryItem struct {
	at time.Time
	id store.LeaseID
}

type leaseHeap []expiryItem

func (h leaseHeap) Len() int { return len(h) }
func (h leaseHeap) Less(i, j int) bool {
	return cmp.Compare(h[i].at.UnixNano(), h[j].at.UnixNano()) < 0
}
func (h leaseHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *leaseHeap) Push(x any)   { *h = append(*h, x.(expiryItem)) }
func (h *leaseHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}
