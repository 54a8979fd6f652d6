package registry

import (
	"context"
	"fmt"
	"time"

	"github.com/beaconplane/beacon"
)

// Registry is the discovery interface: processes register the instances they
// serve, callers list and watch them. Implementations: *StoreRegistry over
// any store.Store (etcd, memory, file, nats).
//
// Registry composes the small interfaces below; code that only registers
// should accept a Registrar, code that only discovers a Discoverer.
type Registry interface {
	Registrar
	Discoverer
	// Close ends every registration of this registry (revoking its lease)
	// and every watch. It is idempotent and bounded by the lease TTL.
	Close() error
}

// Registrar registers instances.
type Registrar interface {
	// Register advertises the instance until the returned Registration is
	// closed or drained, or the registry is closed. Empty fields are
	// filled: ID with beacon.NewID(), Status with serving, RegisteredAt with
	// the current time. The instance is validated first (names, address,
	// metadata size): nothing is written for a bad instance.
	//
	// An ID held by another live registration (in any process) gives an
	// error matching beacon.ErrAlreadyRegistered; it is never overwritten.
	Register(ctx context.Context, in beacon.Instance) (Registration, error)
}

// Discoverer lists and watches instances.
type Discoverer interface {
	// List returns the instances q selects, sorted by key (namespace,
	// component, endpoint, ID), and the store revision of that consistent
	// snapshot. A watch that resumes from that revision (FromRevision)
	// continues it without gap.
	List(ctx context.Context, q beacon.Query) ([]beacon.Instance, int64, error)
	// Watch follows the instances q selects. It returns at once, without
	// waiting for the network; the first Batch is the snapshot (see
	// Watcher). The watch ends when ctx is done or the Watcher is closed;
	// ending it never produces Removed events or an empty list.
	Watch(ctx context.Context, q beacon.Query, opts ...WatchOption) (Watcher, error)
}

// Registration is one registered instance.
type Registration interface {
	// Instance returns the instance as this process advertises it: a
	// copy of its own, as a watcher reads it (empty metadata reads as
	// none).
	Instance() beacon.Instance
	// Update changes the instance: mutate receives a copy and may change
	// Address, Transport, Metadata and Status; the identity (namespace,
	// component, endpoint, ID, registered_at) must stay as it is. The new
	// instance is validated and written with compare-and-swap; on an error
	// nothing changes (also after a recovery, which re-registers the
	// instance as it was before the failed Update).
	//
	// An instance an operator drained in the store (see Operator) stays
	// draining unless mutate sets Status: mutate may be called again, with
	// the instance as drained, when Update finds the drain.
	Update(ctx context.Context, mutate func(*beacon.Instance)) error
	// Drain marks the instance draining (resolvers stop sending new work
	// to it), waits for the grace period (DrainGrace option, default
	// Config.DrainGrace) or until ctx is done, then deregisters it. Ending
	// ctx ends the grace period early; the draining mark and the removal
	// are each bounded by the lease TTL and happen regardless.
	Drain(ctx context.Context, opts ...DrainOption) error
	// Close deregisters the instance now. It is idempotent, bounded by the
	// lease TTL, and a no-op after Drain.
	Close() error
	// Err reports why the instance is not advertised right now, or nil: an
	// error matching beacon.ErrAlreadyRegistered if, after a lease loss,
	// another live process took the ID (the registry keeps trying to
	// reclaim it), or ErrLeaseLost while the session recovers.
	Err() error
}

// Watcher delivers the changes to the instances a Watch selects.
//
// The first Batch is the synced moment: a Snapshot holding every instance
// selected (possibly none), or, for a watch that resumed with FromRevision,
// the Changes since that revision. After it come Changes and Resync batches
// in revision order. Events are coalesced per consumer: a consumer that
// reads slowly receives, for every instance that changed, one event taking
// it from what the consumer last saw to the latest state, so it never
// blocks other watchers and always converges to the latest state.
//
// When the watch loses its connection to the store it delivers one Stale
// batch (Err says why) and keeps retrying; once reconnected it re-lists and
// delivers a Resync batch (possibly empty) with the difference against what
// the consumer already saw: no missed removal, no phantom removal, and a
// changed address under the same ID as Updated.
type Watcher interface {
	// Next blocks until there is a batch to deliver, ctx is done, or the
	// watch ends. It returns ErrWatchClosed after Close or once the Watch
	// context is done, ErrClosed after the registry closed, and ctx.Err()
	// when ctx is done. It must not be called concurrently with itself.
	Next(ctx context.Context) (Batch, error)
	// Instances returns the consumer's current view: every instance
	// delivered so far and not removed, sorted by key. It is safe to call
	// concurrently with Next, and keeps the last view after the watch ends
	// (local cancellation never empties it).
	Instances() []beacon.Instance
	// Close ends the watch. It is idempotent.
	Close() error
}

// BatchKind says how to apply a Batch.
type BatchKind uint8

const (
	// Snapshot replaces the consumer's state: Events holds every selected
	// instance as Added (possibly none). It is always the first batch of a
	// watch, unless the watch resumed (FromRevision) and the changes since
	// that revision were still available.
	Snapshot BatchKind = iota + 1
	// Changes holds the changes since the previous batch.
	Changes
	// Resync holds the difference between what the consumer saw and the
	// state once the watch is back: after a reconnect or compaction
	// re-list, or when a store watch that an outage silenced resumes
	// without a gap. Apply it like Changes.
	Resync
	// Stale reports that the watch lost the store and is retrying: the view
	// may be out of date. Events is empty and Err says why; a Resync batch
	// follows when the watch is back (changes that arrive before that come
	// as Changes, the view still possibly out of date).
	Stale
)

func (k BatchKind) String() string {
	switch k {
	case Snapshot:
		return "snapshot"
	case Changes:
		return "changes"
	case Resync:
		return "resync"
	case Stale:
		return "stale"
	}
	return "unknown"
}

// MarshalText renders the kind as snapshot, changes, resync or stale.
func (k BatchKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Batch is one delivery of a Watcher.
type Batch struct {
	Kind BatchKind
	// Events are ordered by revision (then key). Each carries the revision
	// of its change; changes found by re-listing carry the listing's
	// revision. A Removed event carries the last state the consumer saw.
	Events []beacon.Event
	// Revision is the store revision the consumer's view is at once the
	// batch is applied. It is the point to resume from: a watch with
	// FromRevision(Revision) continues after this batch. (Resume only at
	// batch boundaries: events inside a batch are coalesced.)
	Revision int64
	// Err is set on Stale batches.
	Err error
}

// WatchOption modifies one Watch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	fromRevision int64
}

// FromRevision resumes a watch after revision rev (a Batch.Revision the
// consumer already applied, e.g. an SSE Last-Event-ID). If the changes
// since rev are still available, the first batch is Changes with exactly
// those changes (possibly none); otherwise it is a Snapshot, and the
// consumer must replace its state. Zero means a fresh watch. On a store
// registry, a revision beyond the store's current one (never given by this
// store) makes Next fail with an error matching beacon.ErrInvalid.
func FromRevision(rev int64) WatchOption {
	return func(o *watchOptions) { o.fromRevision = rev }
}

// DrainOption modifies one Drain.
type DrainOption func(*drainOptions)

type drainOptions struct {
	grace    time.Duration
	hasGrace bool
}

// DrainGrace sets how long the instance stays advertised as draining before
// it is removed.
func DrainGrace(d time.Duration) DrainOption {
	return func(o *drainOptions) { o.grace, o.hasGrace = d, true }
}

// Optional capabilities. Consumers that serve any Registry (the HTTP API,
// and whatever else `beacon serve` builds on the registry) take the narrow
// interfaces above and find these by type assertion, as the store does with
// store.Transactor: every backend serves every consumer, and a capability a
// backend lacks is refused with a clear error instead of not compiling.

// Getter reads one instance. Registries without it are read through List
// (see Get).
type Getter interface {
	// Get returns the instance at ref, or an error matching
	// beacon.ErrNotFound.
	Get(ctx context.Context, ref beacon.Ref) (beacon.Instance, error)
}

// LeasedRegistrar registers instances on behalf of remote clients (Beacon's
// HTTP API): each registration is bound to a lease of its own that the
// client keeps alive, so that it disappears when that client stops, not when
// the serving process does; and it is owned by whoever holds the Secret
// returned at registration, never by whoever names its lease.
// *StoreRegistry implements it (see leased.go for the rules); a registry
// without leases does not, and the HTTP API then refuses registration over
// HTTP while it still lists and watches.
//
// Heartbeat, UpdateLeased and DeregisterLeased answer a wrong or missing
// secret exactly as an unknown instance (an error matching
// beacon.ErrNotFound, same message), and act only on the registration's
// own lease.
type LeasedRegistrar interface {
	RegisterWithTTL(ctx context.Context, in beacon.Instance, ttl time.Duration) (Owned, error)
	Heartbeat(ctx context.Context, ref beacon.Ref, secret Secret) (time.Duration, error)
	UpdateLeased(ctx context.Context, ref beacon.Ref, secret Secret, mutate func(*beacon.Instance)) (beacon.Instance, error)
	DeregisterLeased(ctx context.Context, ref beacon.Ref, secret Secret) error
}

// Operator acts on any instance, whoever registered it: what an operator
// with write access to the namespace could do with etcdctl, for Beacon's
// HTTP API and dashboard, which use it through a registry acting as the
// authenticated etcd user (etcd's roles decide, as for every other write).
// Neither call needs the registration's secret or touches its lease.
// *StoreRegistry implements it (see operator.go); a registry without it
// (kubernetes) does not, and the HTTP API then answers operator actions
// with 501.
//
// Owners see an operator's drain: a session (Register) adopts it, and
// keeps the instance draining until its own Update sets Status again; an
// HTTP owner's heartbeats keep working. An operator's deregistration of a
// live session's instance does not last: the session writes it again (see
// StateChange.Drained and Config.VerifyInterval). To take a live process
// out of rotation, drain it (or stop the process); deregister instances
// whose owner is gone or misbehaving.
type Operator interface {
	// DrainInstance marks the instance at ref draining with
	// compare-and-swap (retried when it changes meanwhile), keeping its
	// lease and every other field, and returns it as stored. An instance
	// already draining is returned unchanged. An unknown instance gives
	// an error matching beacon.ErrNotFound.
	DrainInstance(ctx context.Context, ref beacon.Ref) (beacon.Instance, error)
	// DeregisterInstance deletes the key of the instance at ref with
	// compare-and-swap on the revision it read (retried when it changes
	// meanwhile), and nothing else: its lease, and what else is bound to
	// the lease, stay. An unknown instance gives an error matching
	// beacon.ErrNotFound.
	DeregisterInstance(ctx context.Context, ref beacon.Ref) error
}

// TTLReporter writes the reports of TTL checks (beacon.CheckTTL): a
// service's own "I am fine", at least once per the TTL its check declares,
// apart from its lease (see report.go). *StoreRegistry implements it;
// registry/kube does not (it has no store for reports, and refuses TTL
// checks).
type TTLReporter interface {
	// Report reports for an instance registered through this registry
	// (Register), under the session's lease.
	Report(ctx context.Context, ref beacon.Ref) error
	// ReportLeased reports for a registration made with RegisterWithTTL,
	// whose secret the caller presents, under its own lease; a wrong
	// secret answers as Heartbeat's does.
	ReportLeased(ctx context.Context, ref beacon.Ref, secret Secret) error
}

// VerdictKeeper is a Registry that keeps health checkers' verdicts itself,
// without a store.Store to write them to (registry/kube keeps each
// checker's verdicts in the checker's own InstanceSet). A health.Checker
// over such a registry writes through its VerdictSink; over any other, to
// the store behind it (Keyspace.HealthKey, under the checker's lease).
type VerdictKeeper interface {
	// VerdictSink returns where the checker with the given ID keeps its
	// verdicts, or an error saying what the registry lacks to keep them
	// (registry/kube: the pod identity).
	VerdictSink(checkerID string) (VerdictSink, error)
}

// VerdictSink holds one checker's verdicts. The registry's view counts
// them only while the checker is live (registry/kube: while its pod is
// Ready), so that a dead checker's verdicts are ignored (fail-open), and
// joins them to the instances as it joins stored ones.
type VerdictSink interface {
	// PutVerdict makes h the checker's verdict on the instance at ref. It
	// may return before the verdict is visible to readers; the sink keeps
	// trying until it is.
	PutVerdict(ctx context.Context, ref beacon.Ref, h beacon.Health) error
	// DeleteVerdict removes the checker's verdict on the instance at ref,
	// if it has one.
	DeleteVerdict(ctx context.Context, ref beacon.Ref) error
	// Close removes every verdict of the checker, within a bounded time.
	Close() error
}

// SessionReporter reports the state of a registry's own session: the lease
// its Register calls are bound to.
type SessionReporter interface {
	// State returns the session's current state.
	State() State
	// States delivers the session's state changes; see
	// StoreRegistry.States.
	States() <-chan StateChange
}

// Get returns the instance at ref from d: through Getter when d has it,
// otherwise by listing ref's endpoint. An unknown instance gives an error
// matching beacon.ErrNotFound.
func Get(ctx context.Context, d Discoverer, ref beacon.Ref) (beacon.Instance, error) {
	if err := ref.Validate(); err != nil {
		return beacon.Instance{}, err
	}
	if g, ok := d.(Getter); ok {
		return g.Get(ctx, ref)
	}
	return GetByList(ctx, d, ref)
}

// GetByList returns the instance at ref from d by listing ref's endpoint:
// Get for a Discoverer without Getter, and the Get of a backend that can do
// no better. An unknown instance gives an error matching beacon.ErrNotFound.
func GetByList(ctx context.Context, d Discoverer, ref beacon.Ref) (beacon.Instance, error) {
	if err := ref.Validate(); err != nil {
		return beacon.Instance{}, err
	}
	ins, _, err := d.List(ctx, beacon.Query{Namespace: ref.Namespace, Component: ref.Component, Endpoint: ref.Endpoint})
	if err != nil {
		return beacon.Instance{}, err
	}
	for _, in := range ins {
		if in.ID == ref.ID {
			return in, nil
		}
	}
	return beacon.Instance{}, fmt.Errorf("%w: %s", beacon.ErrNotFound, ref)
}
