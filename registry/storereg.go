package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/defaults"
	"github.com/beaconplane/beacon/registry/internal/healthjoin"
	"github.com/beaconplane/beacon/store"
)

// StoreRegistry is the Registry over any store.Store: etcd (the default),
// memory, file or nats. Create it with New; Close it to revoke its lease and
// end its watches. It is safe for concurrent use.
//
// One StoreRegistry holds one session: one lease for every instance it
// registers, granted at the first Register and kept alive every TTL/3. Use
// one StoreRegistry per process.
//
// The registry does not own the store: closing the registry leaves the
// store open, and the caller closes it afterwards.
type StoreRegistry struct {
	st store.Store
	tx store.Transactor // nil if the store has no transactions
	// progress is the store when its watches promise progress
	// notifications (store.ProgressWatcher with an interval), else nil.
	progress store.ProgressWatcher
	cfg      Config
	ks       beacon.Keyspace
	log      *slog.Logger
	m        *metrics

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the registry starts

	closed    atomic.Bool
	closeOnce sync.Once

	lists   chan struct{} // a slot per feed listing in flight (listFeed)
	sess    *session
	hub     *hub
	creates *batcher
	leased  *leasedTracker // leasedmetrics.go
	perms   permCache      // refuse.go
	health  *healthBoard   // health.go
	dynBad  *reporter      // dynview.go
}

var (
	_ Registry   = (*StoreRegistry)(nil)
	_ Registrar  = (*StoreRegistry)(nil)
	_ Discoverer = (*StoreRegistry)(nil)

	_ Getter          = (*StoreRegistry)(nil)
	_ LeasedRegistrar = (*StoreRegistry)(nil)
	_ SessionReporter = (*StoreRegistry)(nil)
	_ TTLReporter     = (*StoreRegistry)(nil)
)

// New returns a registry over st. It does not contact the store: the lease
// is granted by the first Register.
func New(st store.Store, cfg Config) (*StoreRegistry, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ks, _ := beacon.NewKeyspace(cfg.Root) // validated above
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("%w: metrics: %w", ErrInvalidConfig, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &StoreRegistry{
		st:       st,
		cfg:      cfg,
		ks:       ks,
		log:      cfg.Logger.With("component", "registry"),
		m:        m,
		ctx:      ctx,
		cancel:   cancel,
		lists:    make(chan struct{}, maxFeedLists),
		progress: store.PromisedProgress(st),
	}
	if tx, ok := st.(store.Transactor); ok {
		r.tx = tx
		r.creates = newBatcher(batcherDeps{txn: tx.Txn, spawn: r.spawn, opContext: r.opContext, undo: r.undo})
	}
	r.health = newHealthBoard(r.log, m, cfg.HealthPanicThreshold)
	r.dynBad = newReporter(r.log, m, maxReported)
	r.sess = newSession(r)
	r.hub = newHub(r)
	r.leased = newLeasedTracker(cfg.LeaseTTL)
	m.trackLeased(r.leased)
	return r, nil
}

// Keyspace returns the key layout the registry reads and writes.
func (r *StoreRegistry) Keyspace() beacon.Keyspace { return r.ks }

// LeaseTTL returns the TTL the session asks for.
func (r *StoreRegistry) LeaseTTL() time.Duration { return r.cfg.LeaseTTL }

// GrantedTTL returns the TTL the store granted the session's current
// lease, which may be longer than asked (etcd grants at least its minimum,
// about 2 s by default); 0 while the session holds none.
func (r *StoreRegistry) GrantedTTL() time.Duration {
	if r.sess.currentLease() == store.NoLease {
		return 0
	}
	_, ttl := r.sess.k.current()
	return ttl
}

// MaxMetadataSize returns the metadata limit instances are checked against.
func (r *StoreRegistry) MaxMetadataSize() int { return r.cfg.MaxMetadataSize }

// States delivers the session's state changes (active, lost, recovered,
// closed). The channel is buffered; if the reader falls behind, the oldest
// changes are dropped so that the latest is always delivered. It is closed
// by Close, after the StateClosed change.
func (r *StoreRegistry) States() <-chan StateChange { return r.sess.states }

// State returns the session's current state.
func (r *StoreRegistry) State() State { return r.sess.currentState() }

// Lease returns the session's current lease (store.NoLease before the
// first Register and while the lease is lost).
func (r *StoreRegistry) Lease() store.LeaseID { return r.sess.currentLease() }

// Close ends every watch, revokes the session lease (deleting every
// instance registered through this registry, so that watchers see them go)
// within a timeout of one lease TTL, and closes States. It is idempotent.
// The store stays open.
func (r *StoreRegistry) Close() error {
	var err error
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		r.m.untrackLeased(r.leased)
		r.hub.close()
		r.cancel()
		r.wg.Wait()
		err = r.sess.close()
	})
	return err
}

// minOpTimeout is the least time the registry gives one store operation it
// does on its own behalf.
const minOpTimeout = 5 * time.Second

// opContext bounds one store operation the registry does on its own behalf
// (a batched write, a recovery step, a cleanup) by max(lease TTL, 5 s) and
// by Close.
func (r *StoreRegistry) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, max(r.cfg.LeaseTTL, minOpTimeout))
}

// prepare fills an instance's defaults, validates it and encodes it with
// the TTL of the lease its registrant keeps it alive with (0: unknown).
// The instance returned shares in's Metadata map and Check
// (defaults.Fill): a caller that hands it back clones it.
func (r *StoreRegistry) prepare(in beacon.Instance, ttl time.Duration) (beacon.Instance, []byte, error) {
	in, err := defaults.Fill(in, r.cfg.MaxMetadataSize)
	if err != nil {
		return beacon.Instance{}, nil, err
	}
	in.Health = nil // the checkers' verdict: never advertised by a registrant
	val, err := encode(in, ttl)
	if err != nil {
		return beacon.Instance{}, nil, err
	}
	return in, val, nil
}

// encodeBufs holds encode's scratch buffers.
var encodeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// encode returns the stored value of in: MarshalJSON's object, plus
// lease_ttl_ms when ttl is known (see storedTTL).
func encode(in beacon.Instance, ttl time.Duration) ([]byte, error) {
	in.Health = nil // the checkers' verdict, never stored with the instance
	// MarshalJSON's bytes, written directly when the instance allows it
	// (json.Marshal would also re-scan and compact what MarshalJSON
	// returns, an eighth of a registration's CPU, to the same bytes).
	// Written in a scratch buffer, then copied at its size: the value is
	// kept as long as the registration, and a buffer grown by appending
	// (the TTL member tipped a 256-byte one over) kept up to twice that.
	scratch := encodeBufs.Get().(*[]byte)
	defer encodeBufs.Put(scratch)
	val, ok := appendInstance((*scratch)[:0], in)
	var err error
	if !ok {
		val, err = in.MarshalJSON()
	}
	if err != nil {
		return nil, fmt.Errorf("registry: encode instance %s: %w", in.Ref(), err)
	}
	val = appendTTL(val, ttl)
	if ok {
		if cap(val) <= 64<<10 {
			*scratch = val[:0] // grown for a large instance: kept for the next
		}
		val = bytes.Clone(val)
	}
	if err := store.ValidateValue(val); err != nil {
		return nil, fmt.Errorf("registry: instance %s: %w", in.Ref(), err)
	}
	return val, nil
}

// decode parses a stored key/value into an instance, checking that the
// value belongs at its key.
func (r *StoreRegistry) decode(kv store.KeyValue) (beacon.Instance, error) {
	ref, err := r.ks.Parse(kv.Key)
	if err != nil {
		return beacon.Instance{}, err
	}
	in, err := beacon.UnmarshalInstance(kv.Value)
	if err != nil {
		return beacon.Instance{}, fmt.Errorf("value at %s: %w", kv.Key, err)
	}
	if in.Ref() != ref {
		return beacon.Instance{}, fmt.Errorf("value at %s describes instance %s: key and value disagree", kv.Key, in.Ref())
	}
	in.Health = nil // never stored: the view joins the checkers' verdict
	return in, nil
}

// List implements Discoverer. Values that are not valid instances or
// verdicts are skipped (and counted in
// beacon_registry_invalid_values_total). Instances carry their health as
// a watch's do.
func (r *StoreRegistry) List(ctx context.Context, q beacon.Query) ([]beacon.Instance, int64, error) {
	if err := r.checkQuery(q); err != nil {
		return nil, 0, err
	}
	if r.closed.Load() {
		return nil, 0, ErrClosed
	}
	kvs, rev, err := r.st.List(ctx, r.ReadPrefix(q))
	if err != nil {
		return nil, 0, fmt.Errorf("registry: list %q: %w", q.String(), err)
	}
	l := r.readListing(kvs)
	if r.dynamo() {
		v := newDynView(q, r.dynBad)
		v.replace(l.dyn)
		l.items = v.items()
	}
	j := healthjoin.New(r.cfg.HealthPanicThreshold)
	j.ReplaceVerdicts(l.verdicts)
	j.JoinAll(l.items)
	out := make([]beacon.Instance, len(l.items))
	for i, it := range l.items {
		out[i] = it.Inst
	}
	return out, rev, nil
}

// Get returns one instance, or an error matching beacon.ErrNotFound. An
// instance that declares a check is read with its whole endpoint, in one
// listing: its health depends on its service's (the panic threshold). So
// is every instance in the dynamo layout: its entries may be under any
// padding of its ID, and its model cards elsewhere.
func (r *StoreRegistry) Get(ctx context.Context, ref beacon.Ref) (beacon.Instance, error) {
	if r.dynamo() {
		if err := r.checkRef(ref); err != nil {
			return beacon.Instance{}, err
		}
		return r.getListed(ctx, ref)
	}
	in, _, err := r.get(ctx, ref)
	if err != nil || in.Check == nil {
		return in, err
	}
	return r.getListed(ctx, ref)
}

// getListed returns the instance at ref from a listing of its endpoint.
func (r *StoreRegistry) getListed(ctx context.Context, ref beacon.Ref) (beacon.Instance, error) {
	ins, _, err := r.List(ctx, beacon.Query{Namespace: ref.Namespace, Component: ref.Component, Endpoint: ref.Endpoint})
	if err != nil {
		return beacon.Instance{}, fmt.Errorf("registry: get %s: %w", ref, err)
	}
	for _, in := range ins {
		if in.ID == ref.ID {
			return in, nil
		}
	}
	return beacon.Instance{}, fmt.Errorf("%w: %s", beacon.ErrNotFound, ref)
}

// get returns the instance and its key/value (for its lease and revision).
func (r *StoreRegistry) get(ctx context.Context, ref beacon.Ref) (beacon.Instance, store.KeyValue, error) {
	return r.getWith(ctx, ref, r.st.Get)
}

// getWith is get, reading the key with read.
func (r *StoreRegistry) getWith(ctx context.Context, ref beacon.Ref, read func(context.Context, string) (store.KeyValue, error)) (beacon.Instance, store.KeyValue, error) {
	if err := r.checkRef(ref); err != nil {
		return beacon.Instance{}, store.KeyValue{}, err
	}
	if r.closed.Load() {
		return beacon.Instance{}, store.KeyValue{}, ErrClosed
	}
	kv, err := read(ctx, r.ks.Key(ref))
	if errors.Is(err, store.ErrNotFound) {
		return beacon.Instance{}, store.KeyValue{}, fmt.Errorf("%w: %s", beacon.ErrNotFound, ref)
	}
	if err != nil {
		return beacon.Instance{}, store.KeyValue{}, fmt.Errorf("registry: get %s: %w", ref, err)
	}
	in, err := r.decode(kv)
	if err != nil {
		return beacon.Instance{}, store.KeyValue{}, fmt.Errorf("registry: get %s: %w", ref, err)
	}
	return in, kv, nil
}

func (r *StoreRegistry) invalidValue(key string, err error) {
	r.m.invalidValue()
	r.log.Warn("skipping a stored value that is not a valid instance", "key", key, "err", err)
}
