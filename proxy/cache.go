package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/google/btree"
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The serializable read cache.
//
// A serializable Range is one the client accepts from any member without
// a quorum round: as fresh as that member happens to be. The proxy can
// answer such reads itself, from a copy of the keyspace fed by a watch
// (like a follower fed by the raft log), with a stated bound on how stale
// the answer may be:
//
//   - The copy is loaded with a linearizable paginated read at one
//     revision, then follows an upstream watch from the next revision
//     (through the watch hub, so it moves with the watches when a member
//     hangs). It always holds the keyspace exactly as of one revision.
//   - While reads arrive, every CacheMaxStaleness/2 the proxy makes a
//     linearizable count-only read of one key, with no credentials: its
//     revision R is the cluster's at the time t0 it was sent, and once the
//     copy has applied R the copy is known to be current as of t0. A read
//     is answered from the copy only if that is less than
//     CacheMaxStaleness ago: so every answer reflects every write
//     committed before now - CacheMaxStaleness. Otherwise it is forwarded.
//   - A read also waits for nothing the client wrote through this proxy:
//     the copy answers only once it holds the revision of the last write
//     the proxy forwarded (read-your-writes through the proxy).
//   - Linearizable reads, reads at a revision, and reads carrying
//     credentials (a token: etcd must check the user's permissions) are
//     always forwarded. When the cluster requires authentication the
//     credential-less probe fails and the cache turns itself off (within
//     the same bound if authentication is turned on later).
//   - A keyspace larger than CacheMaxBytes turns the cache off (logged,
//     beacon_proxy_cache_state 0): reads are forwarded, nothing is lost.
//
// beacon_proxy_cache_revision_lag is the revisions the copy is behind the
// newest the proxy knows of (probe and forwarded writes), and
// beacon_proxy_cache_staleness_seconds the age of its last confirmation.

// Cache states (beacon_proxy_cache_state).
const (
	cacheOff      = iota // not started (no serializable read yet), or turned off
	cacheLoading         // loading or reloading
	cacheServing         // following the watch
	cacheDisabled        // too large, or the cluster requires authentication
)

// Defaults of the cache's settings.
const (
	DefaultCacheMaxStaleness = time.Second
	DefaultCacheMaxBytes     = 256 << 20
)

// cacheStream marks the cache's upstream watch, so that it has a gRPC
// watch stream of its own (its progress is nobody else's).
const cacheStream = "serializable-cache"

// kvOverhead is what one cached key costs beside its key and value.
const kvOverhead = 96

type rangeCache struct {
	p        *Proxy
	maxStale time.Duration
	maxBytes int64

	mu       sync.RWMutex
	state    int
	why      string // why it is disabled or reloading
	tree     *btree.BTreeG[*mvccpb.KeyValue]
	rev      int64 // the revision the copy reflects
	cluster  uint64
	member   uint64
	term     uint64
	bytes    int64
	fresh    time.Time // the copy was current at this time
	probeRev int64     // the last probe's revision (0: none waiting)
	probeAt  time.Time // when that probe was sent
	newest   int64     // newest revision known (probes, forwarded writes)
	probing  bool
	retryAt  time.Time // a disabled or failed cache is retried after this
	w        *cwatcher // the cache's watcher on the hub
}

func newRangeCache(p *Proxy) *rangeCache {
	return &rangeCache{p: p, maxStale: p.cfg.CacheMaxStaleness, maxBytes: p.cfg.CacheMaxBytes}
}

func kvLess(a, b *mvccpb.KeyValue) bool { return bytes.Compare(a.Key, b.Key) < 0 }

// cacheable reports whether req may be answered from the cache: a
// serializable read at the current revision, with no credentials, and
// nothing etcd would refuse (an empty key, an unknown sort option).
func cacheable(ctx context.Context, req *pb.RangeRequest) bool {
	if !req.Serializable || req.Revision != 0 || len(req.Key) == 0 {
		return false
	}
	if _, ok := pb.RangeRequest_SortOrder_name[int32(req.SortOrder)]; !ok {
		return false
	}
	if _, ok := pb.RangeRequest_SortTarget_name[int32(req.SortTarget)]; !ok {
		return false
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(rpctypes.TokenFieldNameGRPC)) == 0 && len(md.Get("authorization")) == 0
}

// serve answers req from the cache if it is fresh enough; ok false means
// forward it.
func (c *rangeCache) serve(req *pb.RangeRequest) (resp *pb.RangeResponse, ok bool) {
	now := time.Now()
	c.mu.RLock()
	state, fresh, rev, newest := c.state, c.fresh, c.rev, c.newest
	needProbe := state == cacheServing && !c.probing && now.Sub(c.probeAt) >= c.maxStale/2
	start := state == cacheOff || (state == cacheDisabled && now.After(c.retryAt))
	if state == cacheServing && now.Sub(fresh) < c.maxStale && rev >= newest {
		resp = c.rangeLocked(req)
	}
	c.mu.RUnlock()
	switch {
	case start:
		c.start()
	case needProbe:
		c.probe()
	}
	m := c.p.m
	switch {
	case resp != nil:
		m.cacheHits.Inc()
		return resp, true
	case state == cacheServing:
		m.cacheMisses.WithLabelValues("stale").Inc()
	case state == cacheLoading:
		m.cacheMisses.WithLabelValues("loading").Inc()
	default:
		m.cacheMisses.WithLabelValues("off").Inc()
	}
	return nil, false
}

// rangeLocked computes a Range over the copy as etcd does
// (etcdserver/txn/range.go): count is the keys in the range, revision
// filters prune, a sort other than by ascending key sorts, limit cuts
// (more), keys-only drops values.
func (c *rangeCache) rangeLocked(req *pb.RangeRequest) *pb.RangeResponse {
	resp := &pb.RangeResponse{Header: &pb.ResponseHeader{ClusterId: c.cluster, MemberId: c.member, Revision: c.rev, RaftTerm: c.term}}
	var kvs []*mvccpb.KeyValue
	count := 0
	collect := !req.CountOnly
	defaultOrder := req.SortOrder == pb.RangeRequest_NONE ||
		(req.SortTarget == pb.RangeRequest_KEY && req.SortOrder == pb.RangeRequest_ASCEND)
	filters := req.MinModRevision != 0 || req.MaxModRevision != 0 || req.MinCreateRevision != 0 || req.MaxCreateRevision != 0
	// With the default order and no filter, keys past limit+1 are only
	// counted.
	want := -1
	if defaultOrder && !filters && req.Limit > 0 {
		want = int(req.Limit) + 1
	}
	visit := func(kv *mvccpb.KeyValue) bool {
		count++
		if collect && (want < 0 || len(kvs) < want) {
			kvs = append(kvs, kv)
		}
		return true
	}
	key, end := req.Key, req.RangeEnd
	switch {
	case len(end) == 0:
		if kv, ok := c.tree.Get(&mvccpb.KeyValue{Key: key}); ok {
			visit(kv)
		}
	case len(end) == 1 && end[0] == 0:
		c.tree.AscendGreaterOrEqual(&mvccpb.KeyValue{Key: key}, visit)
	case bytes.Compare(end, key) > 0:
		c.tree.AscendRange(&mvccpb.KeyValue{Key: key}, &mvccpb.KeyValue{Key: end}, visit)
	}
	resp.Count = int64(count)
	if req.CountOnly {
		return resp
	}
	if filters {
		kvs = slices.DeleteFunc(kvs, func(kv *mvccpb.KeyValue) bool {
			return (req.MaxModRevision != 0 && kv.ModRevision > req.MaxModRevision) ||
				(req.MinModRevision != 0 && kv.ModRevision < req.MinModRevision) ||
				(req.MaxCreateRevision != 0 && kv.CreateRevision > req.MaxCreateRevision) ||
				(req.MinCreateRevision != 0 && kv.CreateRevision < req.MinCreateRevision)
		})
	}
	order := req.SortOrder
	if req.SortTarget != pb.RangeRequest_KEY && order == pb.RangeRequest_NONE {
		order = pb.RangeRequest_ASCEND
	}
	if !(order == pb.RangeRequest_NONE || (req.SortTarget == pb.RangeRequest_KEY && order == pb.RangeRequest_ASCEND)) {
		less := func(a, b *mvccpb.KeyValue) bool {
			switch req.SortTarget {
			case pb.RangeRequest_VERSION:
				return a.Version < b.Version
			case pb.RangeRequest_CREATE:
				return a.CreateRevision < b.CreateRevision
			case pb.RangeRequest_MOD:
				return a.ModRevision < b.ModRevision
			case pb.RangeRequest_VALUE:
				return bytes.Compare(a.Value, b.Value) < 0
			}
			return bytes.Compare(a.Key, b.Key) < 0
		}
		if order == pb.RangeRequest_DESCEND {
			sort.Sort(sort.Reverse(kvSorter{kvs, less}))
		} else {
			sort.Sort(kvSorter{kvs, less})
		}
	}
	if req.Limit > 0 && len(kvs) > int(req.Limit) {
		kvs = kvs[:req.Limit]
		resp.More = true
	}
	if req.KeysOnly {
		// etcd reads keys-only ranges from its index alone, which has no
		// lease, unless it must sort by value.
		fromIndex := req.SortTarget != pb.RangeRequest_VALUE
		for i, kv := range kvs {
			c := &mvccpb.KeyValue{Key: kv.Key, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Lease: kv.Lease}
			if fromIndex {
				c.Lease = 0
			}
			kvs[i] = c
		}
	}
	resp.Kvs = kvs
	return resp
}

// kvSorter sorts like etcd: sort.Sort (not stable) with the same less
// functions, so equal elements end in the same order as etcd's.
type kvSorter struct {
	kvs  []*mvccpb.KeyValue
	less func(a, b *mvccpb.KeyValue) bool
}

func (s kvSorter) Len() int           { return len(s.kvs) }
func (s kvSorter) Swap(i, j int)      { s.kvs[i], s.kvs[j] = s.kvs[j], s.kvs[i] }
func (s kvSorter) Less(i, j int) bool { return s.less(s.kvs[i], s.kvs[j]) }

// start loads the copy in the background (once at a time).
func (c *rangeCache) start() {
	c.mu.Lock()
	if c.state == cacheLoading || c.state == cacheServing {
		c.mu.Unlock()
		return
	}
	c.state, c.why = cacheLoading, ""
	c.mu.Unlock()
	if !c.p.watchHub().spawn(c.load) {
		c.mu.Lock()
		c.state = cacheOff
		c.mu.Unlock()
	}
}

// token is the token of the cache's own reads and watch. The cache serves
// only requests without credentials, so it reads as one: never as the
// proxy's client certificate (anonymous.go). While the cluster has
// authentication on, its reads are refused and it turns itself off.
func (c *rangeCache) token() string {
	if c.p.hasClientCert() {
		return anonymousToken
	}
	return ""
}

// metadata is the outgoing metadata of the cache's own reads.
func (c *rangeCache) metadata() metadata.MD {
	md := metadata.Pairs(viaKey, c.p.id)
	if t := c.token(); t != "" {
		md.Set(rpctypes.TokenFieldNameGRPC, t)
	}
	return md
}

// pageSize is the keys per page of the load.
const pageSize = 1000

// load reads the whole keyspace at one revision, page by page, then
// follows it with a watch from the next revision.
func (c *rangeCache) load() {
	h := c.p.watchHub()
	ctx, cancel := context.WithTimeout(h.ctx, 5*time.Minute)
	defer cancel()
	ctx = metadata.NewOutgoingContext(ctx, c.metadata())
	tree := btree.NewG(32, kvLess)
	var size, rev int64
	var hdr *pb.ResponseHeader
	var loadedAt time.Time
	key := []byte{0}
	for {
		req := &pb.RangeRequest{Key: key, RangeEnd: []byte{0}, Limit: pageSize, Revision: rev}
		resp := new(pb.RangeResponse)
		sent := time.Now()
		if _, _, err := c.p.invoke(ctx, kvSvc+"Range", req, resp, false, true); err != nil {
			c.failed(err)
			return
		}
		if resp.Header == nil {
			c.failed(errors.New("proxy: a range response without header"))
			return
		}
		if rev == 0 {
			rev, loadedAt, hdr = resp.Header.Revision, sent, resp.Header
		}
		for _, kv := range resp.Kvs {
			tree.ReplaceOrInsert(kv)
			size += int64(len(kv.Key)+len(kv.Value)) + kvOverhead
		}
		if size > c.maxBytes {
			c.disable(fmt.Sprintf("the keyspace is larger than the cache's %d MiB (%s)", c.maxBytes>>20, c.p.cfg.setting("proxy.Config.CacheMaxBytes")), time.Time{})
			return
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		key = append(slices.Clone(resp.Kvs[len(resp.Kvs)-1].Key), 0)
	}
	w := &cwatcher{id: -1, sink: c, key: watchKey{key: "\x00", end: "\x00", stream: cacheStream, token: c.token()}}
	c.mu.Lock()
	c.tree, c.bytes, c.rev, c.w = tree, size, rev, w
	c.cluster, c.member, c.term = hdr.ClusterId, hdr.MemberId, hdr.RaftTerm
	c.fresh, c.state = loadedAt, cacheServing
	c.mu.Unlock()
	if !h.attachSink(w, rev+1) {
		c.failed(errors.New("proxy: closing"))
		return
	}
	c.p.log.Info("serializable cache loaded", "keys", tree.Len(), "bytes", size, "revision", rev)
}

// failed turns the cache off after an error; it is tried again at the
// next read, at most every 5 s. An authentication error disables it for
// a minute: the proxy has no credentials of its own.
func (c *rangeCache) failed(err error) {
	if isAuthError(err) {
		c.disable("the cluster requires authentication: "+status.Convert(err).Message(), time.Now().Add(time.Minute))
		return
	}
	c.p.log.Warn("serializable cache off; retrying at the next read", "err", err)
	c.disable(err.Error(), time.Now().Add(5*time.Second))
}

// disable stops the cache until retry (forever when zero).
func (c *rangeCache) disable(why string, retry time.Time) {
	c.mu.Lock()
	w := c.w
	was := c.state
	c.state, c.why, c.tree, c.bytes, c.w = cacheDisabled, why, nil, 0, nil
	c.retryAt = retry
	if retry.IsZero() {
		c.retryAt = time.Now().Add(100 * 365 * 24 * time.Hour)
	}
	c.mu.Unlock()
	if w != nil {
		c.p.watchHub().detach(w)
	}
	if was != cacheDisabled {
		c.p.log.Info("serializable cache off; serializable reads are forwarded", "reason", why)
	}
}

func isAuthError(err error) bool {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return true
	case codes.InvalidArgument:
		m := status.Convert(err).Message()
		return m == rpctypes.ErrorDesc(rpctypes.ErrGRPCUserEmpty) || m == rpctypes.ErrorDesc(rpctypes.ErrGRPCInvalidAuthToken)
	}
	return false
}

// apply applies a batch of events from the watch (sink).
func (c *rangeCache) apply(b *evBatch, from int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != cacheServing {
		return
	}
	for _, ev := range b.events {
		kv := ev.Kv
		if kv.ModRevision < from {
			continue
		}
		old, had := c.tree.Get(kv)
		if had {
			c.bytes -= int64(len(old.Key)+len(old.Value)) + kvOverhead
		}
		switch ev.Type {
		case mvccpb.PUT:
			c.tree.ReplaceOrInsert(kv)
			c.bytes += int64(len(kv.Key)+len(kv.Value)) + kvOverhead
		case mvccpb.DELETE:
			c.tree.Delete(kv)
		}
	}
	c.rev = max(c.rev, b.last)
	if b.hdr != nil {
		c.cluster, c.member, c.term = b.hdr.ClusterId, b.hdr.MemberId, b.hdr.RaftTerm
	}
	c.confirmLocked()
	if c.bytes > c.maxBytes {
		go c.disable(fmt.Sprintf("the keyspace grew larger than the cache's %d MiB (%s)", c.maxBytes>>20, c.p.cfg.setting("proxy.Config.CacheMaxBytes")), time.Time{})
	}
}

// progress records a progress notification of the watch (sink): every
// event up to rev has been applied.
func (c *rangeCache) progress(rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == cacheServing {
		c.rev = max(c.rev, rev)
		c.confirmLocked()
	}
}

// ended reports the watch's end (compaction, member gone with nowhere to
// go): the copy is dropped and reloaded at the next read.
func (c *rangeCache) ended(reason string) {
	c.mu.Lock()
	if c.state != cacheServing {
		c.mu.Unlock()
		return
	}
	c.state, c.why, c.tree, c.bytes, c.w = cacheOff, reason, nil, 0, nil
	c.mu.Unlock()
	c.p.log.Info("serializable cache watch ended; reloading at the next read", "reason", reason)
}

// confirmLocked marks the copy fresh as of the waiting probe once it has
// applied the probe's revision.
func (c *rangeCache) confirmLocked() {
	if c.probeRev != 0 && c.rev >= c.probeRev {
		if c.probeAt.After(c.fresh) {
			c.fresh = c.probeAt
		}
		c.probeRev = 0
	}
}

// probe reads the cluster's revision (linearizable, one key, count only,
// no credentials) and records it to confirm the copy against.
func (c *rangeCache) probe() {
	c.mu.Lock()
	if c.probing || c.state != cacheServing {
		c.mu.Unlock()
		return
	}
	c.probing = true
	c.mu.Unlock()
	h := c.p.watchHub()
	if !h.spawn(func() {
		defer func() {
			c.mu.Lock()
			c.probing = false
			c.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(h.ctx, c.maxStale)
		defer cancel()
		ctx = metadata.NewOutgoingContext(ctx, c.metadata())
		sent := time.Now()
		resp := new(pb.RangeResponse)
		_, _, err := c.p.invoke(ctx, kvSvc+"Range", &pb.RangeRequest{Key: []byte{0}, CountOnly: true}, resp, false, true)
		if err != nil || resp.Header == nil {
			if isAuthError(err) {
				c.failed(err)
			}
			return // not confirmed: reads are forwarded until a probe works
		}
		c.mu.Lock()
		c.probeRev, c.probeAt = resp.Header.Revision, sent
		c.newest = max(c.newest, resp.Header.Revision)
		c.confirmLocked()
		c.mu.Unlock()
	}) {
		c.mu.Lock()
		c.probing = false
		c.mu.Unlock()
	}
}

// wrote records the revision of a write the proxy forwarded (its
// response), so that later reads through the proxy see it.
func (c *rangeCache) wrote(resp []byte) {
	rev := headerRevision(resp)
	if rev == 0 {
		return
	}
	c.mu.Lock()
	c.newest = max(c.newest, rev)
	c.mu.Unlock()
}

// headerRevision reads header.revision (field 1, then field 3) of an
// encoded etcd response; 0 if there is none.
func headerRevision(b []byte) int64 {
	v, ok := protoField(b, 1, protowire.BytesType)
	if !ok {
		return 0
	}
	hdr, n := protowire.ConsumeBytes(v)
	if n < 0 {
		return 0
	}
	if v, ok = protoField(hdr, 3, protowire.VarintType); !ok {
		return 0
	}
	rev, n := protowire.ConsumeVarint(v)
	if n < 0 {
		return 0
	}
	return int64(rev)
}

// protoField finds the first field num of type typ in the encoded message
// b and returns b from its value on; false if there is none or b is
// malformed before it.
func protoField(b []byte, num protowire.Number, typ protowire.Type) ([]byte, bool) {
	for len(b) > 0 {
		fnum, ftyp, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		if fnum == num && ftyp == typ {
			return b, true
		}
		n = protowire.ConsumeFieldValue(fnum, ftyp, b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
	}
	return nil, false
}

// stats for the metrics.
func (c *rangeCache) stats() (state int, lag int64, staleness time.Duration, keys int, size int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	state = c.state
	if state != cacheServing {
		return state, 0, 0, 0, 0
	}
	return state, max(0, c.newest-c.rev), time.Since(c.fresh), c.tree.Len(), c.bytes
}

// registerCacheMetrics exports the cache's state as gauges read at
// scrape time.
func (p *Proxy) registerCacheMetrics(reg prometheus.Registerer) error {
	read := func(pick func(state int, lag int64, stale time.Duration, keys int, size int64) float64) func() float64 {
		return func() float64 {
			if p.cache == nil {
				return pick(cacheOff, 0, 0, 0, 0)
			}
			return pick(p.cache.stats())
		}
	}
	f := promreg.With(nil) // registered below, not shared: a second proxy on one Registerer is an error
	f.GaugeFunc("beacon_proxy_cache_state",
		"The serializable read cache: 0 off (no serializable read yet, or being reloaded), 1 loading, 2 serving, 3 disabled (too large, or the cluster requires authentication).",
		read(func(s int, _ int64, _ time.Duration, _ int, _ int64) float64 { return float64(s) }))
	f.GaugeFunc("beacon_proxy_cache_revision_lag",
		"Revisions the cache is behind the newest the proxy knows of (its freshness probes and the writes it forwarded).",
		read(func(_ int, lag int64, _ time.Duration, _ int, _ int64) float64 { return float64(lag) }))
	f.GaugeFunc("beacon_proxy_cache_staleness_seconds",
		"Age of the cache's last confirmation that it held every committed write; answers are served only while it is below the staleness bound.",
		read(func(_ int, _ int64, st time.Duration, _ int, _ int64) float64 { return st.Seconds() }))
	f.GaugeFunc("beacon_proxy_cache_keys",
		"Keys in the serializable read cache.",
		read(func(_ int, _ int64, _ time.Duration, k int, _ int64) float64 { return float64(k) }))
	f.GaugeFunc("beacon_proxy_cache_bytes",
		"Approximate memory of the serializable read cache's keys and values.",
		read(func(_ int, _ int64, _ time.Duration, _ int, b int64) float64 { return float64(b) }))
	return promreg.RegisterEach(reg, f.Made()...)
}

// cachedRange answers an encoded RangeRequest from the cache when it may.
func (p *Proxy) cachedRange(ctx context.Context, data []byte) (*pb.RangeResponse, bool) {
	var req pb.RangeRequest
	if err := proto.Unmarshal(data, &req); err != nil || !cacheable(ctx, &req) {
		return nil, false
	}
	return p.cache.serve(&req)
}
