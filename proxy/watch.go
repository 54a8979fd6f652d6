package proxy

import (
	"context"
	"encoding/binary"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/internal/etcdwatch"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Watch coalescing.
//
// Client watchers on the same range (same key, range end, prev-kv option,
// auth token and require-leader flag) share upstream watches. An upstream
// u keeps an etcdwatch.Position, whose Next (u's nextrev below) says
// every event with a revision below it has been handed to its receivers,
// and every event at or above it is still to come. A client watcher w
// with its own nextrev (the first revision it still needs) may receive
// from u whenever u.nextrev <= w.nextrev; it skips events below its own
// nextrev. A watcher "from now" (start revision 0)
// joins any existing upstream, taking max(current revision+1, u.nextrev)
// as its start, so identical watches always share one upstream watch. A
// watcher that needs older history gets its own upstream from its start
// revision; once that upstream has caught up, the two are merged into the
// one that is behind (which loses nothing for either side) and the other
// is cancelled.
//
// Delivery (receivers.go, watchstream.go, watchenc.go): an upstream
// response becomes one shared batch; each client stream queues a
// reference to it with the list of its watchers that need it, and the
// stream's sender splices each watcher's response from encoded parts,
// merging what waited side by side for the same watchers.

type watchKey struct {
	key, end      string
	token         string
	via           string
	requireLeader bool
	prevKV        bool
	stream        string // an internal consumer's own gRPC stream (the cache)
}

// group selects the clientv3 gRPC watch stream (one per credentials).
func (k watchKey) group() watchKey {
	return watchKey{token: k.token, via: k.via, requireLeader: k.requireLeader, stream: k.stream}
}

// streamKey is the metadata key that gives an internal consumer's watches
// a gRPC stream of their own (etcd ignores it).
const streamKey = "beacon-proxy-stream"

// watchHub coalesces the client watchers into upstream watches.
// Lock order: watchHub.mu, then upstream.mu (two upstreams only under
// watchHub.mu: the one whose receivers move, then the other), then
// waitState.shedMu, then waitState.cstreamsMu, then cstream.mu or
// rangeCache.mu, which are innermost (one cstream.mu at a time).
type watchHub struct {
	p      *Proxy
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // the endpoints changed (watchmember.go)
	// watchers counts the client watchers (Config.MaxWatchers).
	watchers atomic.Int64

	mu      sync.Mutex
	member  string                          // the member the upstream watches run on
	cli     *clientv3.Client                // a client of that member alone
	w       clientv3.Watcher                // cli.Watcher
	leaving error                           // why the watches must leave member (nil: they need not)
	silent  bool                            // leaving because member was silent for the timeout
	probes  map[watchKey]*etcdwatch.Silence // the silence check of each gRPC watch stream (watchKey.group)
	groups  map[watchKey][]*upstream
	closed  bool

	waitState // what waits for the client streams (watchwait.go)
}

// upstream is one upstream watch and the client watchers it feeds.
// Lock order: watchHub.mu before upstream.mu before cstream.mu.
type upstream struct {
	hub   *watchHub
	key   watchKey
	heard atomic.Int64 // when a response last came, unix nanoseconds

	mu       sync.Mutex
	ctx      context.Context
	cancel   context.CancelFunc
	gen      int // which watch feeds it (restart starts a new one)
	caughtUp bool
	closed   bool
	recv     receivers // receivers.go
	// pos is what u knows of revisions: Next (nextrev) the first one not
	// yet handed to the receivers, OpenedAt the start of the current
	// watch, Known the highest revision etcd reported on u's watches (or
	// their stream). Its policy decides when u's watch is opened again,
	// and from where (ReplaceFrom, Compacted), and which events it
	// repeats (Fresh).
	pos etcdwatch.Position
}

// cwatcher is one client watcher.
type cwatcher struct {
	id      int64
	variant int         // filterVariant of its filters
	s       *cstream    // its client stream
	sink    *rangeCache // an internal consumer instead of a client stream (s nil)
	up      *upstream   // guarded by hub.mu
	slot    int         // its place in up's receivers; guarded by up.mu
	progres bool
	key     watchKey
}

func newWatchHub(p *Proxy) *watchHub {
	ctx, cancel := context.WithCancel(context.Background())
	return &watchHub{p: p, ctx: ctx, cancel: cancel, kick: make(chan struct{}, 1),
		probes: map[watchKey]*etcdwatch.Silence{}, groups: map[watchKey][]*upstream{},
		waitState: waitState{cstreams: map[*cstream]struct{}{}}}
}

// close cancels every upstream watch and waits for their goroutines.
func (h *watchHub) close() {
	h.mu.Lock()
	h.closed = true
	cli := h.cli
	h.mu.Unlock()
	h.cancel()
	if cli != nil {
		_ = cli.Close()
	}
	h.wg.Wait()
}

// watcherAdded and watcherRemoved count client watchers.
func (h *watchHub) watcherAdded() {
	h.watchers.Add(1)
	h.p.m.clientWatchers.Inc()
}

func (h *watchHub) watcherRemoved() {
	h.watchers.Add(-1)
	h.p.m.clientWatchers.Dec()
}

// attach puts w on a fitting upstream (or a new one) and queues its
// created response before any event. It refuses (false) when the hub is
// closed, or w's stream has ended: the stream's detachAll marks it ended
// before it detaches its watchers under h.mu, so a watcher whose create
// was still under way (its Range in flight) is either attached before and
// detached by it, or refused here: never left on an upstream
// (TestHubNoWatcherAttachedAfterItsStreamEnded).
//
// The upstream is chosen (or opened) and joined under one hold of its
// lock: its dispatch moves its next revision under that lock alone, so an
// upstream that fitted once may be past w's start by the time it is
// locked again, and a new one may have dispatched events before w is on
// it (TestHubWatcherFromThePastJoinsOnlyAnUpstreamNotPastItsStart).
func (h *watchHub) attach(w *cwatcher, start int64, hdr *pb.ResponseHeader) bool {
	if hdr == nil {
		hdr = &pb.ResponseHeader{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || w.s.ended() {
		return false
	}
	current := hdr.Revision
	want := start
	if want == 0 {
		want = current + 1
	}
	u := h.lockFittingLocked(w.key, want)
	if u == nil && start == 0 {
		// From now: the most recent upstream also counts as now.
		u = h.lockLeastAheadLocked(w.key)
	}
	if u == nil {
		u = h.lockNewUpstream(w.key, want, start == 0)
	}
	defer u.mu.Unlock()
	next := max(want, u.pos.Next) // want, unless from now on an upstream ahead
	rev := current
	if start == 0 {
		rev = next - 1
	}
	w.up = u
	w.s.enqueue(&pb.WatchResponse{Header: withRevision(hdr, rev), WatchId: w.id, Created: true})
	u.recv.add(w, next)
	return true
}

// attachSink attaches an internal consumer from revision rev, on its own
// upstream watch unless one of the same range and stream is at rev.
func (h *watchHub) attachSink(w *cwatcher, rev int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	u := h.lockFittingLocked(w.key, rev)
	if u == nil {
		u = h.lockNewUpstream(w.key, rev, false)
	}
	w.up = u
	u.recv.add(w, rev)
	u.mu.Unlock()
	return true
}

// lockFittingLocked returns, locked, the first upstream of range k that
// has handed its receivers nothing at or above rev (its next revision is
// not above it), so that a watcher from rev loses nothing on it; nil:
// none. h.mu is held (the groups hold only open upstreams).
func (h *watchHub) lockFittingLocked(k watchKey, rev int64) *upstream {
	for _, u := range h.groups[k] {
		u.mu.Lock()
		if u.pos.Next <= rev {
			return u
		}
		u.mu.Unlock()
	}
	return nil
}

// lockLeastAheadLocked returns, locked, the upstream of range k whose
// next revision is the lowest (each read under its own lock: it may have
// moved on by the time the chosen one is locked again, which a watcher
// from now does not mind); nil: none. h.mu is held.
func (h *watchHub) lockLeastAheadLocked(k watchKey) *upstream {
	var (
		best     *upstream
		bestNext int64
	)
	for _, u := range h.groups[k] {
		u.mu.Lock()
		next := u.pos.Next
		u.mu.Unlock()
		if best == nil || next < bestNext {
			best, bestNext = u, next
		}
	}
	if best != nil {
		best.mu.Lock()
	}
	return best
}

// lockNewUpstream starts an upstream watch from rev and returns it
// locked, so that no response of its watch is dispatched before the
// caller has added the receiver it was opened for; h.mu is held.
func (h *watchHub) lockNewUpstream(k watchKey, rev int64, current bool) *upstream {
	u := &upstream{hub: h, key: k, pos: etcdwatch.Position{Next: rev}, caughtUp: current, recv: newReceivers()}
	u.heard.Store(time.Now().UnixNano())
	h.groups[k] = append(h.groups[k], u)
	h.p.m.upstreamWatches.Inc()
	u.mu.Lock()
	u.watchLocked(h.w, rev)
	return u
}

// watchLocked starts the watch that feeds u, on w from revision from
// (u.pos.Next, or below it: dispatch drops the events it repeats); u.mu
// (and h.mu) are held.
func (u *upstream) watchLocked(w clientv3.Watcher, from int64) {
	h, k := u.hub, u.key
	md := metadata.MD{}
	if k.token != "" {
		md.Set(rpctypes.TokenFieldNameGRPC, k.token)
	}
	via := []string{}
	if k.via != "" {
		via = strings.Split(k.via, ",")
	}
	md.Set(viaKey, append(via, h.p.id)...)
	if k.stream != "" {
		md.Set(streamKey, k.stream)
	}
	ctx := metadata.NewOutgoingContext(h.ctx, md)
	if k.requireLeader {
		ctx = clientv3.WithRequireLeader(ctx)
	}
	u.ctx, u.cancel = context.WithCancel(ctx)
	u.gen++
	u.pos.OpenedAt = from
	opts := []clientv3.OpOption{clientv3.WithRev(from), clientv3.WithProgressNotify(), clientv3.WithCreatedNotify()}
	if k.prevKV {
		opts = append(opts, clientv3.WithPrevKV())
	}
	if k.end != "" {
		opts = append(opts, clientv3.WithRange(k.end))
	}
	// Watch returns once etcd has created the watch: never under a lock
	// (a hung member would hold it for good).
	ctx, gen := u.ctx, u.gen
	h.wg.Go(func() { u.run(w.Watch(ctx, k.key, opts...), gen) })
}

// restart feeds u, an upstream of a group (so open: h.mu is held), from
// a new watch on w (another member), from the first revision it has not
// delivered.
func (u *upstream) restart(w clientv3.Watcher) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.heard.Store(time.Now().UnixNano())
	u.reopenLocked(w, u.pos.Next)
}

// reopenLocked feeds u from a new watch on w from revision from, in place
// of the current one; u.mu (and h.mu) are held.
func (u *upstream) reopenLocked(w clientv3.Watcher, from int64) {
	u.cancel()
	u.watchLocked(w, from)
}

// context is the context of u's current watch (its metadata selects the
// gRPC watch stream).
func (u *upstream) context() context.Context {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.ctx
}

// stop cancels u's current watch.
func (u *upstream) stop() {
	u.mu.Lock()
	cancel := u.cancel
	u.mu.Unlock()
	cancel()
}

// current reports whether gen is still the watch that feeds u.
func (u *upstream) current(gen int) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gen == gen
}

func (u *upstream) run(wch clientv3.WatchChan, gen int) {
	h := u.hub
	var lastErr error
	for wr := range wch {
		u.heard.Store(time.Now().UnixNano())
		if err := wr.Err(); err != nil {
			lastErr = err
		}
		u.dispatch(&wr, gen)
		h.maybeMerge(u)
	}
	if !u.current(gen) {
		return // restarted on another member
	}
	// The channel closed: cancelled by us, or the watch failed.
	reason := "proxy: upstream watch ended"
	if lastErr != nil {
		reason = lastErr.Error()
	}
	u.end(nil, 0, reason)
}

// dispatch hands one upstream response of watch gen to the receivers.
func (u *upstream) dispatch(wr *clientv3.WatchResponse, gen int) {
	if !u.current(gen) {
		return // from the watch on the member the watches left
	}
	if wr.CompactRevision != 0 && wr.Header != nil && u.reopenCompacted(wr.CompactRevision, wr.Header.Revision, gen) {
		return
	}
	if wr.Canceled || wr.CompactRevision != 0 {
		reason := wr.CancelReason
		if err := wr.Err(); err != nil {
			reason = err.Error()
		}
		u.end(wr.Header, wr.CompactRevision, reason)
		return
	}
	hdr := wr.Header
	if hdr == nil {
		hdr = &pb.ResponseHeader{}
	}
	var done []*cstream
	u.mu.Lock()
	u.pos.Reported(hdr.Revision)
	switch {
	case wr.Created:
		if !u.caughtUp {
			defer u.hub.requestProgress(u.key)
		}
	case wr.IsProgressNotify():
		u.pos.Progress(hdr.Revision)
		u.caughtUp = true
		u.recv.each(func(e *recvEntry) {
			e.nextrev = max(e.nextrev, hdr.Revision+1)
			w := e.w
			if w.sink != nil {
				w.sink.progress(hdr.Revision)
				return
			}
			if w.progres {
				w.s.enqueue(&pb.WatchResponse{Header: withRevision(hdr, hdr.Revision), WatchId: w.id})
			}
			if w.s.progressDone(u) {
				done = append(done, w.s)
			}
		})
	default:
		if len(wr.Events) == 0 {
			break
		}
		if hdr.Revision == wr.Events[len(wr.Events)-1].Kv.ModRevision {
			u.caughtUp = true
		}
		evs := u.pos.Fresh(hdr.Revision, wr.Events) // a watch opened below Next repeats some
		if len(evs) == 0 {
			break
		}
		u.fanOut(newBatch(hdr, evs))
		if !u.caughtUp {
			defer u.hub.requestProgress(u.key)
		}
	}
	u.mu.Unlock()
	for _, s := range done {
		s.answerProgress()
	}
}

// reopenCompacted opens u's watch again when watch gen, opened below
// nextrev, is compacted only below it (etcdwatch.Position.Compacted: from
// nextrev, or from etcd's revision rev, which the compacted response
// carries, while nextrev is ahead of it). It reports false when the
// compaction took events a receiver needs (or gen is no longer u's).
func (u *upstream) reopenCompacted(compactRev, rev int64, gen int) bool {
	h := u.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	u.mu.Lock()
	defer u.mu.Unlock()
	if h.closed || u.gen != gen || u.closed {
		return false
	}
	from, err := u.pos.Compacted(compactRev, rev)
	if err != nil {
		return false
	}
	u.heard.Store(time.Now().UnixNano())
	u.reopenLocked(h.w, from)
	return true
}

// end cancels every receiver of u (compaction, permission loss, upstream
// failure) and removes u.
func (u *upstream) end(hdr *pb.ResponseHeader, compactRev int64, reason string) {
	h := u.hub
	h.mu.Lock()
	u.mu.Lock()
	already := u.closed
	u.closed = true // a response in flight reopens nothing (TestHubEndedUpstreamIsClosedAtOnce)
	recv := u.recv.takeAll()
	u.mu.Unlock()
	if !already {
		h.removeLocked(u)
	}
	h.mu.Unlock()
	u.stop()
	if hdr == nil {
		hdr = &pb.ResponseHeader{}
	}
	for _, e := range recv {
		w := e.w
		if w.sink != nil {
			w.sink.ended(reason)
			continue
		}
		// w left u.receivers here (a detach after this finds it gone):
		// count it out here, even when its stream already dropped it.
		h.watcherRemoved()
		w.s.upstreamEnded(w, u, &pb.WatchResponse{Header: withRevision(hdr, hdr.Revision), WatchId: w.id, Canceled: true, CompactRevision: compactRev, CancelReason: reason})
	}
}

// removeLocked drops u from its group; h.mu is held.
func (h *watchHub) removeLocked(u *upstream) {
	ups := h.groups[u.key]
	if i := slices.Index(ups, u); i >= 0 {
		ups = slices.Delete(ups, i, i+1)
		h.p.m.upstreamWatches.Dec()
	}
	if len(ups) == 0 {
		delete(h.groups, u.key)
	} else {
		h.groups[u.key] = ups
	}
}

// maybeMerge folds upstreams of u's range into one: the receivers of the
// upstream that is ahead move to the one that is behind (and caught up).
func (h *watchHub) maybeMerge(u *upstream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ups := h.groups[u.key]
	if len(ups) < 2 || !slices.Contains(ups, u) {
		// Alone, or closed meanwhile (out of its group, its watch
		// stopped): receivers moved to it would get nothing more
		// (TestHubNeverMergesIntoAClosedUpstream).
		return
	}
	for _, v := range ups {
		if v == u {
			continue
		}
		if h.moveLocked(u, v) || h.moveLocked(v, u) {
			return
		}
	}
}

// mergeable reports whether the receivers of from may move to to (both
// open: in their group): to caught up (a watcher from now does not wait
// behind a replay of history), and to not ahead of from (its next
// revision not above from's, so that no receiver of from misses an event
// to has already delivered; TestHubMergesOnlyIntoAnUpstreamNotAhead).
// from.mu and to.mu are held.
func mergeable(from, to *upstream) bool {
	return to.caughtUp && to.pos.Next <= from.pos.Next
}

// moveLocked moves every receiver of from to to, if mergeable; h.mu is
// held.
func (h *watchHub) moveLocked(from, to *upstream) bool {
	from.mu.Lock()
	to.mu.Lock()
	ok := mergeable(from, to)
	if ok {
		for _, e := range from.recv.takeAll() {
			w := e.w
			to.recv.add(w, e.nextrev)
			w.up = to
			if w.s == nil {
				continue
			}
			w.s.mu.Lock()
			if w.s.pending[from] {
				delete(w.s.pending, from)
				w.s.pending[to] = true
			}
			w.s.mu.Unlock()
		}
		from.closed = true // nothing is sent or reopened through it (TestHubMergedUpstreamIsClosedAtOnce)
	}
	to.mu.Unlock()
	from.mu.Unlock()
	if ok {
		h.removeLocked(from)
		from.stop()
	}
	return ok
}

// detach removes w from its upstream, cancelling the upstream when it has
// no receiver left.
func (h *watchHub) detach(w *cwatcher) {
	h.mu.Lock()
	u := w.up
	if u == nil {
		h.mu.Unlock()
		return
	}
	u.mu.Lock()
	was := u.recv.remove(w)
	empty := u.recv.n == 0 && !u.closed
	if empty {
		u.closed = true
	}
	u.mu.Unlock()
	if empty {
		h.removeLocked(u)
	}
	h.mu.Unlock()
	if was && w.sink == nil {
		h.watcherRemoved()
	}
	if empty {
		u.stop()
	}
}

// requestProgress asks etcd for a progress notification on the gRPC watch
// stream of k's credentials (answered once its watches are synced).
func (h *watchHub) requestProgress(k watchKey) {
	h.mu.Lock()
	var ctx context.Context
	for key, ups := range h.groups {
		if key.group() == k.group() && len(ups) > 0 {
			ctx = ups[0].context()
			break
		}
	}
	w := h.w
	h.mu.Unlock()
	if ctx != nil {
		_ = w.RequestProgress(ctx)
	}
}

// withRevision copies a response header with another revision.
func withRevision(h *pb.ResponseHeader, rev int64) *pb.ResponseHeader {
	if h == nil {
		return &pb.ResponseHeader{Revision: rev}
	}
	return &pb.ResponseHeader{ClusterId: h.ClusterId, MemberId: h.MemberId, Revision: rev, RaftTerm: h.RaftTerm}
}

// mayWatch checks, with the client's own credentials (ctx), that it may
// read [key, end), and returns the current revision in the header. It
// asks etcd a read-only serializable transaction with no compare whose
// other branch reads the range: etcd checks every branch's permissions but
// runs only the taken, empty one. A Range of the range itself (even
// count-only, with a limit) makes etcd count every key in it: 9 ms a
// watch created over 100,000 keys against 0.2 ms for the transaction,
// whatever the keys.
//
// Creates of the same range with the same credentials that come while
// such a check is in flight share its answer, as fresh as any
// serializable one: a burst of creates (100,000 watches opened over 20
// streams, each stream's creates one after another) asks etcd once per
// round trip instead of once per watch. The check runs apart from the
// first caller's context, so that one client leaving fails no other.
func (p *Proxy) mayWatch(ctx context.Context, key, end []byte) (*pb.TxnResponse, error) {
	ch := p.watchChecks.DoChan(checkKey(ctx, key, end), func() (any, error) {
		return p.checkWatch(context.WithoutCancel(ctx), key, end)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*pb.TxnResponse), nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// checkKey names a check by its range and every outgoing metadata pair
// (the credentials, the proxies it came through, require-leader), each
// part prefixed by its length: keys and values may hold any byte, and no
// two different checks may share a name.
func checkKey(ctx context.Context, key, end []byte) string {
	md, _ := metadata.FromOutgoingContext(ctx)
	b := make([]byte, 0, 256)
	part := func(p []byte) { b = append(binary.AppendUvarint(b, uint64(len(p))), p...) }
	part(key)
	part(end)
	for _, k := range slices.Sorted(maps.Keys(md)) {
		for _, v := range md[k] {
			part([]byte(k))
			part([]byte(v))
		}
	}
	return string(b)
}

// checkWatch is mayWatch's transaction.
func (p *Proxy) checkWatch(ctx context.Context, key, end []byte) (*pb.TxnResponse, error) {
	if len(key) == 0 {
		key, end = []byte{0}, []byte{0}
	}
	check := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{
		Key: key, RangeEnd: end, Serializable: true, CountOnly: true, Limit: 1}}}
	resp := new(pb.TxnResponse)
	if _, _, err := p.invoke(ctx, kvSvc+"Txn", &pb.TxnRequest{Failure: []*pb.RequestOp{check}}, resp, false, true); err != nil {
		return nil, err
	}
	return resp, nil
}
