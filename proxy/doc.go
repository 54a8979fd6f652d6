// Package proxy is Beacon's etcd proxy: one listener that serves the etcd
// v3 gRPC API (KV, Watch, Lease, Cluster, Maintenance, Auth, and Lock and
// Election passed through), etcd's JSON gateway (/v3/kv/range, /v3/watch,
// ...), /metrics and /health, and forwards to the members of one etcd
// cluster.
//
// In ReadWrite mode (the default) it forwards every request. In ReadOnly
// mode it forwards reads and watches and refuses every write — Put,
// DeleteRange, a Txn containing a write, Compact, lease grant, revoke and
// keep-alive, member and auth changes, defragment, alarm disarm, move
// leader and downgrade — with gRPC Unimplemented (HTTP 501) and a message
// saying the proxy is readonly.
//
// The proxy finds the cluster from one source (Config): an etcd v3
// discovery token (also when the cluster is full), an etcd v2 discovery
// URL, DNS SRV records, an --initial-cluster string, peer URLs, or client
// URLs; by default the member answering at http://localhost:2380. It reads
// the members' client URLs (GET <peer>/members, or MemberList), refreshes
// them every 30 s (every second while none is reachable), shuffles them,
// benches an endpoint that failed for 5 s and fails over to the others:
// reads that fail on a member going down are retried on another, so they
// do not fail. An endpoint that is the proxy's own listener is never used,
// and requests carry a via marker so that loops through other proxies are
// detected too.
//
// Identical client watches share one upstream watch (metrics
// beacon_proxy_client_watchers and beacon_proxy_upstream_watches), and all
// lease keep-alive streams share one upstream stream.
//
// Requests are forwarded as encoded messages without being decoded (only
// a Txn or Alarm request is decoded in readonly mode, and watch and
// keep-alive traffic, which the proxy multiplexes). Each client's own
// metadata — its auth token, require-leader — goes upstream with its
// request; the proxy has no identity of its own.
//
// Embedding (for example `beacon serve --discovery-fallback=proxy`):
//
//	p, err := proxy.New(proxy.Config{PeerURLs: peers, Logger: log, Registry: reg})
//	if err != nil { ... }
//	err = p.Run(ctx) // or p.Serve(ctx, listener); p.Close() stops it
//
// # Watch hub (design note)
//
// Three owners: the hub (watch.go: coalescing and merging, in memory),
// the client stream and its wire encoding (watchstream.go, watchenc.go),
// and the servers' lifecycle (lifecycle.go: start, stop(ctx), the order
// written there). The member the upstream watches run on, and leaving it
// when it is silent, gone or unreachable, is watchmember.go.
//
//	etcd member (one clientv3 client; one gRPC watch stream per credentials)
//	     │ WatchResponse (events, progress, created, canceled)
//	     ▼
//	upstream ─ pos (etcdwatch.Position): events below pos.Next (its
//	  │  nextrev) were handed to its receivers; repeats dropped (Fresh)
//	  │  dispatch: one shared evBatch per response; receivers.go keeps
//	  │  one dense list per client stream (each entry: the watcher's
//	  │  nextrev, ID, filters); maybeMerge after each response
//	  │      ┌────────────────────────────────────────────────────┐
//	  │      │ watchHub.groups[watchKey] = upstreams of one range │
//	  │      │ (key, end, prevKV, token, via, requireLeader)      │
//	  │      │ merge from → to when mergeable: both open, to      │
//	  │      │ caught up, to.pos.Next <= from.pos.Next            │
//	  │      └────────────────────────────────────────────────────┘
//	  ▼ fanOut: per stream, one list of (watch ID, filters, from)
//	cstream queue: qitems (a control response, or a batch for a list of
//	  the stream's watchers; bounded: past maxQueued/maxQueuedBytes the
//	  stream ends ResourceExhausted)
//	     │ sender: between control responses, items of the same list
//	     │ version merged per watcher; splice(header, watch ID, encoded
//	     │ events) into one buffer
//	     ▼
//	client Watch stream
//
// A watcher from now joins an upstream of its range at once; one from the
// past gets its own upstream, merged into the other once caught up.
// What waits for the streams is bounded per stream and, each response
// counted once, for all streams together (watchwait.go: past
// Config.MaxWatchWaitingBytes the streams that waited longest are ended).
// Lock order: watchHub.mu, upstream.mu, waitState.shedMu,
// waitState.cstreamsMu, then cstream.mu or rangeCache.mu.
// The invariants are tested in memory in hub_test.go (every watcher gets
// exactly its events once, in order, under any interleaving; the merge
// condition), the encoding in watchenc_test.go.
package proxy
