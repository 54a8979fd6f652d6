// Package etcdnaming is compatible with etcd's gRPC naming
// (go.etcd.io/etcd/client/v3/naming/endpoints and .../naming/resolver, etcd
// 3.7): the same keys and values, so that Beacon and etcd's own code read
// and write each other's endpoints, and a resolver for etcd:///<target>
// that does not go silently stale.
//
// # Format
//
// An endpoint of target "foo/bar" lives at key "foo/bar/<name>" (by
// convention the address, or an instance ID) with the value etcd's manager
// writes, byte for byte:
//
//	{"Op":0,"Addr":"10.0.0.1:50051","Metadata":{"zone":"a"}}
//
// Readers accept what etcd's accept (field names in any case, "Op" ignored)
// and skip — logged and counted in beacon_naming_skipped_total — values
// that are not a JSON object or have no Addr.
//
// # Manager
//
// A Manager works over a store.Store: over the etcd backend (store/etcd;
// etcd.NewFromClient wraps an existing *clientv3.Client) the keys are etcd
// keys as they are. AddEndpoint, DeleteEndpoint and Update (several
// changes in one transaction, so watchers see them at one revision) check
// that keys start with "<target>/" and that endpoints have an address and
// JSON-encodable metadata; nothing is written on an error. WithLease binds
// an endpoint to a lease.
//
// # Resolver
//
// NewBuilder returns a grpc-go resolver.Builder for the "etcd" scheme:
//
//	b, err := etcdnaming.NewBuilder(etcd.NewFromClient(cli))
//	...
//	cc, err := grpc.NewClient("etcd:///foo/bar", b.DialOption(), ...)
//
// It lists "<target>/", pushes the full state (one endpoint per key, sorted
// by key, metadata in attributes: KeyFrom, MetadataFrom), and watches from
// the listing's revision + 1. Where etcd's resolver stops for good when its
// watch ends (compaction during a partition, a lost leader), this one lists
// again and pushes the full state. A store watch is silent while the store
// is unreachable, so the resolver also probes the store (every
// WithProbeInterval): while it does not answer and the watch delivers
// nothing, the resolver reports an error matching ErrStale (balancers
// keep the endpoints they have). The report ends when the watch delivers
// again (an event, or a progress notification from a store that promises
// them: the watch resumed without a gap) or, when the store answers
// first, with a re-list — after twice the promised progress interval, if
// the watch reported nothing meanwhile (at once from a store that
// promises none). With no endpoint it reports
// ErrNoEndpoints so calls fail fast instead of hanging.
package etcdnaming
