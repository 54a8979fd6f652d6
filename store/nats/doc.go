// Package nats is a store.Store on a NATS JetStream key/value bucket
// (BEACON_DISCOVERY_BACKEND=nats, NATS_URL=nats://host:4222). It needs
// nats-server 2.12 or later (per-message TTLs, subject delete markers,
// atomic batch publish) and refuses older servers with ErrServerTooOld, and
// a server whose max_payload cannot carry a value of store.MaxValueSize
// with its headers with ErrIncompatibleServer (the NATS default, 1 MB, is
// enough).
//
// # Data model
//
// The bucket is the stream KV_<bucket> (subjects $KV.<bucket>.>), created by
// Open with the settings below, and readable by ordinary KV tools. A store
// that only reads (Config.MustExist) never creates it and reports a missing
// one with ErrNoBucket; any other store creates it again, with the same
// settings, when it finds it gone (a server restarted without its JetStream
// data), logs so, and fails that request with store.ErrUnavailable: the
// owners of the registrations, whose leases went with the bucket, write them
// again, and watches end so that their clients list again. Inside it:
//
//	$KV.<bucket>.k.<tokens>   keys: one token per '/'-separated segment,
//	                          bytes outside [-_a-zA-Z0-9] escaped as =XX,
//	                          an empty segment as "=" (reversible; a prefix
//	                          ending in '/' is a subject wildcard)
//	$KV.<bucket>.l.<id>       lease records, with a per-message TTL
//	$KV.<bucket>.c            the compaction watermark
//	$KV.<bucket>.m            a format record (never empty)
//
// The revision is the stream sequence: one global revision per bucket.
// Every write is a compare-and-swap on the key's last message (expected last
// subject sequence), so Create, Update and Delete with IfModRevision are
// exact, and Put keeps the create revision. Each write names the key's
// previous message (header Beacon-Prev), so a watch notices a message it
// needed but the bucket dropped.
//
// # Leases
//
// A lease is a record on its own subject with a per-message TTL; KeepAlive
// writes it again with a fresh TTL (one message per keep-alive, however many
// keys). Keys carry the lease ID and no TTL. A key bound to a lease exists
// while the lease does: when the record expires the server leaves a marker,
// and Revoke writes one; that single message is the revision at which every
// key of the lease is deleted, and watches emit all those deletions there,
// in one response. Writes and deletes of leased keys are atomic batches that
// also rewrite the lease record with a compare-and-swap, so no write can
// slip in after a lease ended (and such a write renews the lease). Keys of
// an ended lease stay in the stream until a watch sees the lease end or a
// List finds them; either deletes them (marked so that watches skip these
// deletions).
//
// The server raises every message TTL to the bucket's marker TTL
// (Config.MarkerTTL, default 1 s), so leases shorter than it are granted
// with the marker TTL.
//
// # Reads and watches
//
// Get reads the key's last message (and its lease). List reads the last
// message of every key under the prefix with one direct-get request that
// the server isolates from writes and that reports the revision it was as
// of, so the snapshot is exact and a watch from its revision + 1 continues
// it; more than 1024 keys are read in chunks as of one revision. Watch is a
// consumer from the requested revision on the prefix's subjects and the
// lease subjects; when it fails (the server lost it, missed heartbeats,
// dropped messages) the watch ends with store.ErrUnavailable rather than
// re-creating it. Every request is bounded by the request timeout and by
// Close, so Close returns promptly whatever the server does.
//
// # Transactions
//
// Txn (store.Transactor) writes one atomic batch: a message per write, each
// with a compare-and-swap on its key, plus the touches of the leases
// involved. The batch's messages get consecutive stream sequences; every
// write of it carries the sequence of the last one as its revision (headers
// Nats-Batch-Sequence and Beacon-Batch), so the transaction is one revision,
// and a watch that starts inside it reads its earlier messages too.
// Revisions therefore skip numbers, which the contract allows.
//
// # Caveats
//
// The conformance suite passes with no caveat. Watches resume from any
// revision the bucket still holds, with these limits, each reported as a
// *store.CompactedError rather than a silent gap:
//
//   - below the watermark set by Compact;
//   - across more than History writes of one key (the stream keeps that
//     many messages per key; default 64);
//   - from further back than the marker TTL when a lease of a key under
//     the prefix has ended and its marker has expired, so the revision of
//     that deletion is unknown.
//
// Reads are direct gets. In a bucket with Replicas > 1 the server lets any
// replica that is nearly caught up answer them (nats-server enables direct
// gets on a follower at 90% synchronised), so a Get or List may miss a write
// another client has just had acknowledged: reads are consistent snapshots
// but not linearizable. Writes stay exact (every compare-and-swap is checked
// by the stream leader), and a watch from a List's revision + 1 still
// continues it without gap. The conformance suite runs on a single server;
// with one replica every read is current.
//
// Compact only sets the watermark; the stream's per-key history bounds its
// size. List and Watch may write (they delete keys of ended leases). Write to the
// bucket only through this package: other writers break the predecessor
// chain and the lease rules.
package nats
