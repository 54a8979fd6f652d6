package memory

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/internal/mvcc"
)

// Defaults for the zero values of Config.
const (
	// DefaultHistory is the number of revisions a store keeps for watches
	// to resume from.
	DefaultHistory = 100_000
	// DefaultHistoryBytes is what the events of those revisions may weigh
	// at most (64 MiB).
	DefaultHistoryBytes = 64 << 20
)

// Config configures a memory store. The zero value is ready to use.
//
// The history watches can start from is bounded twice, and the tighter
// bound decides: in revisions, and in what their events weigh (keys, values
// and about 72 bytes of bookkeeping each). One revision can hold many
// events — a transaction of the registry's group commit holds up to 128,
// the end of a lease all of its keys — so the bound in bytes is the one on
// memory. The current revision is kept whole, whatever its size.
type Config struct {
	// History is how many of the most recent revisions watches can start
	// from; older revisions are compacted automatically. Zero means
	// DefaultHistory; negative means no bound in revisions.
	History int
	// HistoryBytes is what the events of that history may weigh at most;
	// older revisions are compacted automatically. Zero means
	// DefaultHistoryBytes; negative means no bound in bytes. Set both
	// negative to keep everything until Compact.
	HistoryBytes int64
	// FirstRevision is the store's revision before its first write (1,
	// as in etcd, when zero or less). A store that stands for a service
	// clients resume watches from (`beacon serve --backend memory`) starts
	// where no earlier store of the same address reached (FirstRevisionNow),
	// so that a client resuming with a revision of a previous life is
	// compacted and re-lists, rather than get this store's changes since a
	// revision that meant something else: instances of the old life kept
	// for good, new ones missed.
	FirstRevision int64
}

// FirstRevisionNow returns a first revision no store created before it
// in this process or (the clock permitting) an earlier one reached: the
// time in microseconds since the Unix epoch, above every value it
// returned before. Microseconds keep revisions below 2^53, which
// JavaScript's numbers (the dashboard, any JSON reader in a browser)
// hold exactly, for centuries; a store would have to write more than one
// revision a microsecond to reach the next life's first.
func FirstRevisionNow() int64 {
	now := time.Now().UnixMicro()
	for {
		last := lastFirst.Load()
		next := max(now, last+1)
		if lastFirst.CompareAndSwap(last, next) {
			return next
		}
	}
}

var lastFirst atomic.Int64

// Store is an in-memory store.Store: keys, revisions, history and watches
// are the MVCC core's (store/internal/mvcc); the store adds leases that
// expire on a timer. Create it with New; Close it to stop its goroutines.
//
// Lock order: the core's lock, then mu (the core asks leaseAlive under its
// lock).
type Store struct {
	core *mvcc.Store

	mu     sync.Mutex // guards leases, expiry and lastID
	leases map[store.LeaseID]*lease
	expiry leaseHeap
	lastID store.LeaseID

	kick chan struct{} // wakes the expiry loop when the earliest deadline moves
	wg   sync.WaitGroup
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
}

// New returns an empty store at revision Config.FirstRevision, with its
// lease expiry goroutine running.
func New(cfg Config) *Store {
	h := cmp.Or(int64(cfg.History), DefaultHistory)
	hb := cmp.Or(cfg.HistoryBytes, DefaultHistoryBytes)
	s := &Store{
		leases: make(map[store.LeaseID]*lease),
		kick:   make(chan struct{}, 1),
	}
	s.core = mvcc.New(mvcc.Config{History: h, HistoryBytes: hb, LeaseAlive: s.leaseAlive})
	if first := cfg.FirstRevision; first > 1 {
		s.core.Install(first, first, nil)
	}
	s.wg.Add(1)
	go s.expireLoop()
	return s
}

// Close stops the store: its expiry loop and every watch end (watch channels
// close), and every later call fails with store.ErrClosed. Close is
// idempotent.
func (s *Store) Close() error {
	s.core.Close()
	s.wg.Wait()
	return nil
}

// Get implements store.Reader.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	return s.core.Get(ctx, key)
}

// List implements store.Reader.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	return s.core.List(ctx, prefix)
}

// Create implements store.Writer.
func (s *Store) Create(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.core.Commit(ctx, mvcc.Create(key, value, opts))
}

// Put implements store.Writer.
func (s *Store) Put(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.core.Commit(ctx, mvcc.Put(key, value, opts))
}

// Update implements store.Writer.
func (s *Store) Update(ctx context.Context, key string, value []byte, modRevision int64, opts ...store.WriteOption) (int64, error) {
	return s.core.Commit(ctx, mvcc.Update(key, value, modRevision, opts))
}

// Delete implements store.Writer.
func (s *Store) Delete(ctx context.Context, key string, opts ...store.DeleteOption) (int64, error) {
	return s.core.Commit(ctx, mvcc.Delete(key, opts))
}

// Txn implements store.Transactor.
func (s *Store) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	return s.core.Commit(ctx, mvcc.Txn(ops))
}

// Compact implements store.Compactor: watches from revisions below rev
// fail with store.ErrCompacted afterwards.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	return s.core.Compact(ctx, rev)
}

// Watch implements store.Watcher.
func (s *Store) Watch(ctx context.Context, prefix string, fromRevision int64) store.WatchChan {
	return s.core.Watch(ctx, prefix, fromRevision)
}

// leaseAlive is the core's check of a lease a write binds; it runs under
// the core's lock, so a lease ended (removed from the table, then its keys
// deleted by a commit) can never gain a key.
func (s *Store) leaseAlive(id store.LeaseID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases[id] == nil {
		return fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
	}
	return nil
}

// Grant implements store.Leaser.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateTTL(ttl); err != nil {
		return store.Lease{}, err
	}
	if err := s.core.Usable(ctx); err != nil {
		return store.Lease{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastID++
	l := &lease{id: s.lastID, ttl: ttl, deadline: time.Now().Add(ttl)}
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
	if err := s.core.Usable(ctx); err != nil {
		return 0, err
	}
	s.mu.Lock()
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
	if err := s.core.Usable(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	l := s.leases[id]
	delete(s.leases, id)
	s.mu.Unlock()
	if l == nil {
		return fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
	}
	return s.endLease(id)
}

// endLease deletes the keys of a lease already removed from the table, in
// one revision. It must not give up half way (the keys would outlive their
// lease), so it does not take the caller's context: it fails only once the
// store is closed.
func (s *Store) endLease(id store.LeaseID) error {
	_, err := s.core.Commit(context.Background(), mvcc.EndLease(id))
	return err
}

// expireLoop ends leases at their deadlines.
func (s *Store) expireLoop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, wait := s.popExpired(time.Now())
		for _, id := range due {
			_ = s.endLease(id) // fails only once closed
		}
		timer.Reset(wait) // no drain: since Go 1.23 a Reset timer never delivers a stale tick
		select {
		case <-s.core.Done():
			return
		case <-timer.C:
		case <-s.kick:
		}
	}
}

// popExpired removes the leases whose deadline has passed from the table
// and returns them, with the time until the next deadline.
func (s *Store) popExpired(now time.Time) ([]store.LeaseID, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var due []store.LeaseID
	for len(s.expiry) > 0 && !s.expiry[0].at.After(now) {
		it := heap.Pop(&s.expiry).(expiryItem)
		l := s.leases[it.id]
		switch {
		case l == nil: // revoked
		case l.deadline.After(now): // kept alive: wait for the new deadline
			heap.Push(&s.expiry, expiryItem{at: l.deadline, id: l.id})
		default:
			delete(s.leases, l.id)
			due = append(due, l.id)
		}
	}
	if len(s.expiry) == 0 {
		return due, time.Hour
	}
	return due, s.expiry[0].at.Sub(now)
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
