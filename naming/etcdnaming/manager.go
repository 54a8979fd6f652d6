package etcdnaming

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/beaconplane/beacon/naming/internal/publish"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Scheme is the URL scheme of the resolver: etcd:///<target>, as etcd's.
const Scheme = "etcd"

// Defaults of the options.
const (
	// DefaultProbeInterval is how often a resolver checks that the store
	// answers (a watch is silent while the store is unreachable).
	DefaultProbeInterval = 5 * time.Second
	// DefaultRetryMax caps the backoff between attempts to list again
	// after a failure.
	DefaultRetryMax = 5 * time.Second
)

// Option configures a Manager or a Builder. Each option says which it
// applies to; the others ignore it.
type Option func(*options)

type options struct {
	log      *slog.Logger
	metrics  prometheus.Registerer
	scheme   string
	probe    time.Duration
	retryMax time.Duration
}

// WithLogger sets the logger for skipped values and watch trouble (Manager
// and Builder). Nil (the default) discards logs.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithMetrics registers the metrics (beacon_naming_*, scheme="etcd") on reg
// (Manager and Builder). Nil (the default) exports none.
func WithMetrics(reg prometheus.Registerer) Option { return func(o *options) { o.metrics = reg } }

// WithScheme serves another URL scheme than "etcd" (Builder).
func WithScheme(s string) Option { return func(o *options) { o.scheme = s } }

// WithProbeInterval sets how often a resolver checks that the store answers
// (Builder). Zero means DefaultProbeInterval.
func WithProbeInterval(d time.Duration) Option { return func(o *options) { o.probe = d } }

// WithRetryMax caps the backoff between attempts to list again after a
// failure (Builder). Zero means DefaultRetryMax.
func WithRetryMax(d time.Duration) Option { return func(o *options) { o.retryMax = d } }

func buildOptions(opts []Option) (options, *publish.Metrics, error) {
	o := options{scheme: Scheme}
	for _, opt := range opts {
		opt(&o)
	}
	if o.probe < 0 || o.retryMax < 0 {
		return o, nil, fmt.Errorf("%w: probe interval %v and retry max %v may not be negative (0 means the default)",
			ErrInvalidConfig, o.probe, o.retryMax)
	}
	o.probe = cmp.Or(o.probe, DefaultProbeInterval)
	o.retryMax = cmp.Or(o.retryMax, DefaultRetryMax)
	o.log = cmp.Or(o.log, slog.New(slog.DiscardHandler))
	m, err := publish.NewMetrics(o.metrics)
	if err != nil {
		return o, nil, fmt.Errorf("%w: metrics: %w", ErrInvalidConfig, err)
	}
	return o, m, nil
}

// Manager writes and lists the endpoints of one target in the format of
// etcd's go.etcd.io/etcd/client/v3/naming/endpoints: key <target>/<name>,
// value {"Op":0,"Addr":"…","Metadata":…}. Over the etcd backend
// (store/etcd) the keys are etcd keys as they are, so etcd's own manager
// and resolver read what this Manager writes, and the other way round.
// It is safe for concurrent use.
type Manager struct {
	st     store.Store
	tx     store.Transactor // nil: single-key updates only
	target string
	prefix string
	log    *slog.Logger
	m      *publish.Metrics
}

// NewManager returns a manager of target's endpoints in st (use
// etcd.NewFromClient to wrap an existing *clientv3.Client). The target is
// a key prefix without the trailing "/", such as "foo/bar/my-service".
// Options: WithLogger and WithMetrics, for the values List skips.
func NewManager(st store.Store, target string, opts ...Option) (*Manager, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if err := validateTarget(target); err != nil {
		return nil, err
	}
	o, m, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	mg := &Manager{
		st:     st,
		target: target,
		prefix: target + "/",
		log:    o.log.With("component", "etcdnaming", "target", target),
		m:      m,
	}
	mg.tx, _ = st.(store.Transactor)
	return mg, nil
}

func validateTarget(target string) error {
	switch {
	case target == "":
		return fmt.Errorf("%w: empty target; name the key prefix of the endpoints, like foo/bar/my-service", ErrInvalidTarget)
	case strings.HasSuffix(target, "/"):
		return fmt.Errorf("%w %q: remove the trailing '/' (keys are <target>/<name>)", ErrInvalidTarget, target)
	}
	if err := store.ValidateKey(target + "/"); err != nil {
		return fmt.Errorf("%w %q: %w", ErrInvalidTarget, target, err)
	}
	return nil
}

// Target returns the managed target.
func (m *Manager) Target() string { return m.target }

// Update is one change of an Update call, as etcd's endpoints.Update (with
// the lease as a field instead of a clientv3.OpOption).
type Update struct {
	Op       Operation
	Key      string // <target>/<name>
	Endpoint Endpoint
	// Lease binds an added key to a lease: when the lease ends, the
	// endpoint goes away. store.NoLease (zero): no lease.
	Lease store.LeaseID
}

// UpdateOption modifies one Add update.
type UpdateOption func(*Update)

// WithLease binds the endpoint's key to lease id (etcd's
// clientv3.WithLease): keep the lease alive (a registry session or
// store.Leaser.KeepAlive) and the endpoint stays; let it end and the
// endpoint goes.
func WithLease(id store.LeaseID) UpdateOption { return func(u *Update) { u.Lease = id } }

// NewAddUpdate returns an update that writes ep at key.
func NewAddUpdate(key string, ep Endpoint, opts ...UpdateOption) Update {
	u := Update{Op: Add, Key: key, Endpoint: ep}
	for _, opt := range opts {
		opt(&u)
	}
	return u
}

// NewDeleteUpdate returns an update that deletes key.
func NewDeleteUpdate(key string) Update { return Update{Op: Delete, Key: key} }

// AddEndpoint writes ep at key (<target>/<name>, such as
// "foo/bar/my-service/10.0.0.1:50051").
func (m *Manager) AddEndpoint(ctx context.Context, key string, ep Endpoint, opts ...UpdateOption) error {
	return m.Update(ctx, NewAddUpdate(key, ep, opts...))
}

// DeleteEndpoint deletes key. Deleting an absent key is not an error (as
// with etcd's manager).
func (m *Manager) DeleteEndpoint(ctx context.Context, key string) error {
	return m.Update(ctx, NewDeleteUpdate(key))
}

// Update applies every update in one transaction (one store revision, so
// watchers see them together), as etcd's manager does; on any error
// nothing is written. Every key must be <target>/<name> (error matching
// ErrKeyOutsideTarget), appear once, and every added endpoint must have an
// address and JSON-encodable metadata (ErrInvalidEndpoint). Several
// updates need a store with multi-key transactions (store.Transactor: the
// etcd and memory backends); on another store they give ErrNoTransactions.
func (m *Manager) Update(ctx context.Context, updates ...Update) error {
	if len(updates) == 0 {
		return nil
	}
	ops := make([]store.Op, 0, len(updates))
	seen := make(map[string]bool, len(updates))
	for _, u := range updates {
		if err := m.checkKey(u.Key); err != nil {
			return err
		}
		if seen[u.Key] {
			return fmt.Errorf("%w: key %q is updated twice in one call", ErrInvalidEndpoint, u.Key)
		}
		seen[u.Key] = true
		switch u.Op {
		case Add:
			v, err := Encode(u.Endpoint)
			if err != nil {
				return fmt.Errorf("%w (key %q)", err, u.Key)
			}
			ops = append(ops, store.Op{Kind: store.OpPut, Key: u.Key, Value: v, Lease: u.Lease})
		case Delete:
			ops = append(ops, store.Op{Kind: store.OpDelete, Key: u.Key})
		default:
			return fmt.Errorf("%w: bad update op %d for key %q; use Add or Delete", ErrInvalidEndpoint, u.Op, u.Key)
		}
	}
	if m.tx != nil {
		if _, err := m.tx.Txn(ctx, ops...); err != nil {
			return fmt.Errorf("etcdnaming: update %d endpoint(s) of %s: %w", len(ops), m.target, err)
		}
		return nil
	}
	if len(ops) > 1 {
		return fmt.Errorf("%w: %d updates of %s could not be atomic; use the etcd or memory backend, or one update per call",
			ErrNoTransactions, len(ops), m.target)
	}
	op := ops[0]
	var err error
	if op.Kind == store.OpPut {
		_, err = m.st.Put(ctx, op.Key, op.Value, store.WithLease(op.Lease))
	} else if _, err = m.st.Delete(ctx, op.Key); errors.Is(err, store.ErrNotFound) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("etcdnaming: update %q: %w", op.Key, err)
	}
	return nil
}

func (m *Manager) checkKey(key string) error {
	if !strings.HasPrefix(key, m.prefix) || len(key) == len(m.prefix) {
		return fmt.Errorf("%w: key %q: endpoint keys of target %q must be %q followed by a name, like %q",
			ErrKeyOutsideTarget, key, m.target, m.prefix, m.prefix+"10.0.0.1:50051")
	}
	return nil
}

// List returns the target's endpoints by key. Values that are not
// endpoints are left out, logged and counted
// (beacon_naming_skipped_total), as etcd's List skips them.
func (m *Manager) List(ctx context.Context) (map[string]Endpoint, error) {
	kvs, _, err := m.st.List(ctx, m.prefix)
	if err != nil {
		return nil, fmt.Errorf("etcdnaming: list %s: %w", m.target, err)
	}
	out := make(map[string]Endpoint, len(kvs))
	for _, kv := range kvs {
		d, err := decode(kv.Value)
		if err != nil {
			m.m.Skipped(Scheme, skipReason(err))
			m.log.Warn("skipping a value that is not an endpoint", "key", kv.Key, "err", err)
			continue
		}
		out[kv.Key] = d.ep
	}
	return out, nil
}

// skipReason is the metric label of a decoding error.
func skipReason(err error) string {
	if errors.Is(err, errNoAddr) {
		return publish.ReasonNoAddr
	}
	return publish.ReasonInvalidJSON
}
