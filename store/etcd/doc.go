// Package etcd is the production backend of the store contract: a
// store.Store (with store.Compactor and store.Transactor) over an etcd v3
// cluster, through go.etcd.io/etcd/client/v3.
//
//	s, err := etcd.Open(ctx, etcd.ConfigFromEnv()) // ETCD_ENDPOINTS, ETCD_AUTH_*
//	if err != nil {
//		return err // unreachable, bad credentials or TLS files: the error says which
//	}
//	defer s.Close()
//
// Keys and values are stored verbatim and revisions are etcd's own, so
// etcdctl and any other etcd client see what the Store writes, and the
// Store sees what they write.
//
// # Connecting
//
// Config takes the endpoints ("host:port", "http://…" or "https://…"),
// user/password authentication, and TLS files (CA, client certificate and
// key); ConfigFromEnv reads them from the ETCD_* variables. Open dials and
// makes one linearizable read within Config.DialTimeout (5 s by default):
// an unreachable cluster, a wrong password or a TLS mismatch fails there,
// with an error that names the endpoints and, after checking each endpoint
// itself (TCP, TLS handshake, client certificate), the cause and what to
// change. NewFromClient wraps a client the caller owns; Client exposes the
// underlying client for etcd features outside the contract.
//
// # Guarantees, and how etcd provides them
//
//   - Get and List are linearizable reads. List reads in pages of
//     Config.ListPageSize keys (1,000 by default), every page at the
//     revision of the first, so the result is one snapshot at the returned
//     revision (the response header's revision), and Watch(rev+1)
//     continues it without gap or overlap.
//   - Create, Update and Delete with store.IfModRevision are single etcd
//     transactions whose compare is the precondition; when it fails, the
//     same transaction reads the key, so ErrKeyExists, ErrConflict and
//     ErrNotFound are told apart without a race. Txn maps to one etcd
//     transaction (at most --max-txn-ops operations, 128 by default, and
//     --max-request-bytes, 1.5 MiB by default, in all).
//   - Leases are etcd leases. TTLs are whole seconds: Grant rounds up and
//     returns the TTL etcd granted, which is at least etcd's minimum (1.5
//     election timeouts, so 2 s with the default 1 s election timeout).
//     etcd checks expiry every 500 ms, so keys go up to about half a
//     second after the TTL, all in one revision; after a leader change etcd
//     renews every lease, so keys can outlive their TTL by an election.
//     KeepAlive is one keep-alive round trip: the caller (the registry's
//     Session) owns the cadence and sees every failure.
//   - Watches are etcd watches, one response per etcd response, so the
//     events of one revision arrive together; see Store.Watch for
//     reconnects (a short break resumes where it stopped), silence (a
//     watch that hears nothing — no event, no progress notification it
//     asked for — for Config.WatchSilenceTimeout ends with
//     store.ErrWatchSilent, but with several endpoints only when the
//     members' probe leaves one out: while every member answers, or none,
//     the silence is etcd lagging and the watch carries on, up to four
//     silences in a row, rather than re-list on an etcd that cannot keep
//     up), compaction (*store.CompactedError) and leader
//     loss (store.ErrUnavailable).
//   - Compact is etcd's compaction of the whole cluster's history: it
//     affects every client. Production clusters usually compact on their
//     own (--auto-compaction-retention); a watch that falls behind it ends
//     with *store.CompactedError, the signal to re-list.
//
// # Errors and timeouts
//
// etcd's errors map to the store sentinels: a missing lease to
// store.ErrLeaseNotFound, a compacted revision to store.ErrCompacted, and
// an unreachable cluster, a lost leader or a call that outlives its
// deadline to store.ErrUnavailable (wrapping the cause; the call may or may
// not have been applied). A unary call whose context has no deadline gets
// Config.RequestTimeout (5 s by default), so no call hangs on a cluster that
// is down. After Close, or once the client of NewFromClient is closed,
// calls fail with store.ErrClosed. Other etcd errors (permission denied, a
// full quota) are wrapped with a hint.
//
// # A member that hangs
//
// A member that hangs (a stopped process, a stuck disk) still accepts
// connections: gRPC keeps its connection until keep-alive pings time out
// (15 s), and meanwhile sends it a share of every call. With several
// endpoints, a call or watch that gets no answer has the Store probe every
// member (its status and a linearizable read, on a connection of its own,
// within Config.ProbeTimeout); members that do not answer while another
// does, or know no leader while another does, are left out of the client's
// endpoints until a probe finds them answering with a leader (Excluded,
// ExcludedChanged). A hung member then costs one timed-out call per
// caller, not one in three. The read also leaves out a member that answers
// its status but serves nothing in time: one back from a partition whose
// requests do not reach the leader yet, one with a slow disk.
//
// While a watch or call is open, the client pings the server after 10 s
// without traffic, so a dead connection (a crashed member, a dropped NAT
// entry) is found even without those checks; after losing a connection it
// redials with a backoff from 250 ms growing to 1 s (so a short-lease
// session recovers within its TTL). Config.Configure can change any client
// setting.
package etcd
