package store

import (
	"context"
	"time"
)

// LeaseID identifies a lease. NoLease (zero) binds a key to no lease.
type LeaseID int64

// NoLease is the zero LeaseID: the key lives until deleted.
const NoLease LeaseID = 0

// KeyValue is one key with its value and revisions.
type KeyValue struct {
	Key   string
	Value []byte
	// CreateRevision is the revision that created the key; it is kept by
	// Put and Update and reset when the key is deleted and created again.
	CreateRevision int64
	// ModRevision is the revision of the last write to the key. For a
	// delete event it is the revision of the deletion.
	ModRevision int64
	// Lease is the lease the key is bound to, or NoLease.
	Lease LeaseID
}

// Lease is a granted lease.
type Lease struct {
	ID LeaseID
	// TTL is the TTL the backend granted, which may be longer than asked
	// (etcd raises TTLs below its minimum, about 2 s by default).
	TTL time.Duration
}

// Reader reads keys.
type Reader interface {
	// Get returns the key, or an error matching ErrNotFound.
	Get(ctx context.Context, key string) (KeyValue, error)
	// List returns every key that starts with prefix, sorted by key, and
	// the store revision of the snapshot it read. The snapshot is
	// consistent: it holds exactly the writes up to that revision, so a
	// Watch from revision+1 continues it without gap or overlap. The empty
	// prefix lists the whole store.
	List(ctx context.Context, prefix string) ([]KeyValue, int64, error)
}

// Writer writes keys. Each successful write takes one new revision and
// returns it. Values above MaxValueSize are refused with ErrValueTooLarge
// and keys that break ValidateKey with ErrInvalidKey; nothing is written.
type Writer interface {
	// Create writes the key only if it is absent; otherwise it returns an
	// error matching ErrKeyExists.
	Create(ctx context.Context, key string, value []byte, opts ...WriteOption) (int64, error)
	// Put writes the key whether or not it exists.
	Put(ctx context.Context, key string, value []byte, opts ...WriteOption) (int64, error)
	// Update writes the key only if its ModRevision equals modRevision
	// (compare-and-swap; modRevision > 0, as read from the key). It returns
	// ErrConflict if the key changed and ErrNotFound if it is absent.
	Update(ctx context.Context, key string, value []byte, modRevision int64, opts ...WriteOption) (int64, error)
	// Delete removes the key and returns the revision of the deletion. An
	// absent key gives ErrNotFound; with IfModRevision, a key that changed
	// gives ErrConflict and is left alone.
	Delete(ctx context.Context, key string, opts ...DeleteOption) (int64, error)
}

// Leaser grants and maintains leases. When a lease ends, by expiry or
// Revoke, every key bound to it is deleted in one revision, and watchers see
// all those deletions at that revision.
type Leaser interface {
	// Grant creates a lease that expires ttl after its last keep-alive.
	// ttl must be in [MinLeaseTTL, MaxLeaseTTL] (ErrInvalidTTL otherwise);
	// backends may round it up to whole seconds.
	Grant(ctx context.Context, ttl time.Duration) (Lease, error)
	// KeepAlive renews the lease for its full TTL and returns that TTL.
	// An expired or revoked lease gives ErrLeaseNotFound: its keys are gone
	// and the caller must grant a new lease and write them again.
	KeepAlive(ctx context.Context, id LeaseID) (time.Duration, error)
	// Revoke ends the lease now, deleting its keys. An unknown lease gives
	// ErrLeaseNotFound.
	Revoke(ctx context.Context, id LeaseID) error
}

// Watcher streams changes.
type Watcher interface {
	// Watch streams the changes to keys starting with prefix, from
	// fromRevision on (inclusive); fromRevision 0 means "changes after
	// the backend established the watch" (for a remote backend, after the
	// server created it; List then Watch(rev+1) is the exact form).
	// Guarantees:
	//
	//   - events arrive in revision order, each exactly once; the events
	//     of one revision (a lease expiry, a transaction) arrive in one
	//     response;
	//   - a watch may start at any revision not yet compacted, so List
	//     followed by Watch(rev+1) sees every change;
	//   - if fromRevision (or the point a watch must resume from) has been
	//     compacted, the last response carries an error matching
	//     ErrCompacted (a *CompactedError) and the channel closes;
	//   - a backend that loses its server may keep the watch open, silent,
	//     and resume it without gap once the server is back (etcd does);
	//     callers that must know about outages track them separately (the
	//     registry probes the store);
	//   - any other failure ends the watch with a response whose Err is set;
	//   - cancelling ctx, or closing the store, ends it by closing the
	//     channel (without an error response).
	//
	// Invalid arguments and a closed store are reported the same way, as
	// the first response. The channel is always closed eventually; the
	// caller must either drain it or cancel ctx.
	Watch(ctx context.Context, prefix string, fromRevision int64) WatchChan
}

// WatchChan delivers watch responses.
type WatchChan <-chan WatchResponse

// WatchResponse is one batch of events, or the error that ended the watch,
// or (from ProgressWatcher.WatchProgress only) a progress notification.
type WatchResponse struct {
	Events []Event
	// Err, when set, is the last response: the watch has ended.
	Err error
	// Progress, set only on a progress notification (no events, no
	// error), is a revision up to which the watch has delivered every
	// change: the watch is live, and a consumer that missed nothing from
	// it knows its view is complete up to there.
	Progress int64
}

// EventType is the kind of change.
type EventType uint8

const (
	// EventPut is a create or an update.
	EventPut EventType = iota + 1
	// EventDelete is a delete, an expiry or a revoke.
	EventDelete
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "PUT"
	case EventDelete:
		return "DELETE"
	}
	return "UNKNOWN"
}

// Event is one change to one key. For EventDelete, KV holds the key and the
// revision of the deletion (KV.ModRevision) only.
type Event struct {
	Type EventType
	KV   KeyValue
}

// Revision is the revision of the change.
func (e Event) Revision() int64 { return e.KV.ModRevision }

// Store is the key/value contract every Beacon backend implements. See the
// package documentation for the guarantees. Implementations are safe for
// concurrent use. Close releases the store (a client closes its
// connection; an in-process backend ends its goroutines); it is idempotent,
// and every call after it fails with ErrClosed.
type Store interface {
	Reader
	Writer
	Leaser
	Watcher
	Close() error
}

// ProgressWatcher is implemented by stores whose watches can prove they
// are live while nothing changes. A watch stays silent while its server
// is unreachable (etcd's resumes without a gap once it is back), so on a
// quiet prefix silence alone cannot tell "nothing changed" from "cannot
// know"; a progress notification can.
type ProgressWatcher interface {
	// WatchProgress is Watch, with progress notifications besides the
	// events: responses whose Progress is set (see WatchResponse).
	WatchProgress(ctx context.Context, prefix string, fromRevision int64) WatchChan
	// ProgressInterval is how often, at most, a live watch of
	// WatchProgress on a quiet prefix reports progress while its server
	// answers; 0 when this store's watches make no such promise (then
	// they may send progress notifications, but silence proves nothing).
	ProgressInterval() time.Duration
}

// PromisedProgress returns w as a ProgressWatcher if its watches promise
// progress notifications (a ProgressInterval above 0), else nil: the one
// test of whether a consumer may wait for a quiet watch to prove itself.
func PromisedProgress(w Watcher) ProgressWatcher {
	if pw, ok := w.(ProgressWatcher); ok && pw.ProgressInterval() > 0 {
		return pw
	}
	return nil
}

// LocalReader is implemented by stores that can read a key from whichever
// server the call reaches, without a round trip through the cluster's
// leader (etcd's serializable read): the answer may trail the latest
// writes by a little, and it stays fast while the leader is slow (its
// disk, its load) or being replaced. Callers use it where a stale answer
// is checked or harmless; an absent key gives ErrNotFound, as Get.
type LocalReader interface {
	GetLocal(ctx context.Context, key string) (KeyValue, error)
}

// Failover is implemented by stores that leave out, for a while, the
// servers that do not answer while others do (etcd with several
// endpoints). A call that timed out on a hung server is best tried again
// once the store has moved on: at once, the retry may reach the same
// server and time out too.
type Failover interface {
	// ExcludedChanged returns a channel closed at the next change of the
	// servers left out (nil if the store never leaves one out).
	ExcludedChanged() <-chan struct{}
	// Probed has the store check its servers, if it is not doing so
	// already, and returns a channel closed once it has (at once if
	// there is nothing to choose between).
	Probed() <-chan struct{}
}

// Compactor is implemented by stores whose history can be compacted on
// demand. After Compact(rev), watches from a revision below rev fail with
// ErrCompacted. Compacting to a revision already compacted fails with an
// error matching ErrCompacted (not always a *CompactedError: etcd does not
// say how far it compacted).
type Compactor interface {
	Compact(ctx context.Context, revision int64) error
}

// OpKind is the kind of one operation in a transaction.
type OpKind uint8

const (
	// OpPut writes Key.
	OpPut OpKind = iota + 1
	// OpDelete removes Key (absent keys are not an error in a transaction).
	OpDelete
)

// Op is one operation of a transaction, with optional preconditions.
type Op struct {
	Kind  OpKind
	Key   string
	Value []byte
	Lease LeaseID
	// IfAbsent requires the key to be absent.
	IfAbsent bool
	// IfModRevision, when non-zero, requires the key's ModRevision to
	// equal it.
	IfModRevision int64
}

// Transactor is implemented by stores that apply several writes atomically.
type Transactor interface {
	// Txn checks every precondition, then applies every op in one
	// revision, or applies nothing and returns an error matching
	// ErrConflict (a *ConflictError naming the first failed key).
	Txn(ctx context.Context, ops ...Op) (int64, error)
}
