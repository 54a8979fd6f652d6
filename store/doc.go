// Package store defines the key/value contract every Beacon capability stands
// on, and the errors and limits shared by its backends.
//
// A Store is a key space with a global revision that grows with every
// successful write: each write gets a revision larger than every revision
// before it (etcd, memory and file count by one; NATS skips numbers that its
// lease records use). Its guarantees, checked for every backend by the
// conformance suite in store/storetest:
//
//   - Reads. Get returns one key. List(prefix) returns every key under the
//     prefix together with the revision of a consistent snapshot.
//   - Writes. Create writes only if the key is absent (ErrKeyExists
//     otherwise). Put writes unconditionally. Update writes only if the key's
//     ModRevision is the one the caller read (ErrConflict otherwise: a
//     compare-and-swap). Delete removes a key, optionally only if unchanged.
//     A write that is refused writes nothing.
//   - Leases. Grant(ttl) returns a lease; KeepAlive renews it for its full
//     TTL; Revoke ends it. Keys written WithLease are deleted, all in one
//     revision, when the lease ends by expiry or revocation, and watchers see
//     those deletions. A lease that ended gives ErrLeaseNotFound.
//   - Watches. Watch(prefix, rev) streams every change under prefix from
//     revision rev on, in revision order, each exactly once, the events of
//     one revision in one response. It may start at any revision still in
//     the store's history; an older revision ends the watch with a
//     *CompactedError (matching ErrCompacted), the signal to re-list.
//   - Limits. Keys are 1 to MaxKeySize bytes of UTF-8; values at most
//     MaxValueSize bytes; lease TTLs in [MinLeaseTTL, MaxLeaseTTL]. Every
//     backend refuses anything else with ErrInvalidKey, ErrValueTooLarge or
//     ErrInvalidTTL before writing.
//   - Prefixes are byte prefixes: "a/b" matches "a/bc". Callers that mean a
//     directory end the prefix with "/", as Beacon's own key layout does.
//
// Optional capabilities are separate interfaces found by type assertion:
// Compactor (compact history on demand), Transactor (several writes in one
// revision, all or nothing), LocalReader (a read served by whichever
// server answers, without a round trip through a leader),
// ProgressWatcher (watches that report progress on a quiet prefix, so that
// a consumer can tell "nothing changed" from "cannot know") and Failover
// (a store that leaves out servers that do not answer says when it has,
// so that a timed-out call is tried again past the hung server).
//
// Backends: store/etcd (production), store/memory (in-process), store/file
// (several processes on one host, no daemon) and store/nats (NATS JetStream
// KV). backend opens one by name (BEACON_DISCOVERY_BACKEND).
// docs/store.md lists each backend's guarantees and measured costs.
package store
