package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Watch coalescing.
//
// Client watchers on the same range (same key, range end, prev-kv option,
// auth token and require-leader flag) share upstream watches. An upstream
// u keeps nextrev: every event with a revision below nextrev has been
// handed to its receivers, and every event at or above it is still to
// come. A client watcher w with its own nextrev (the first revision it
// still needs) may receive from u whenever u.nextrev <= w.nextrev; it skips
// events below its own nextrev. A watcher "from now" (start revision 0)
// joins any existing upstream, taking max(current revision+1, u.nextrev)
// as its start, so identical watches always share one upstream watch. A
// watcher that needs older history gets its own upstream from its start
// revision; once that upstream has caught up, the two are merged into the
// one that is behind (which loses nothing for either side) and the other
// is cancelled.
//
// Delivery (watchenc.go): an upstream response becomes one shared batch;
// each receiver's stream queues a reference to it, merged with what the
// same watcher already has waiting, and the stream's sender splices the
// client response from encoded parts.

// Bounds of what waits for one client stream. A stream is behind when
// what already waits for it, not yet taken by its sender, is past either
// bound as a new response arrives: it is then ended with ResourceExhausted
// (the client re-watches from its last revision) rather than holding others
// up or growing without end: never a silent drop. A stream within the
// bounds takes the new response whatever its size, so one upstream
// response larger than the bounds on its own (a transaction of many large
// puts) still reaches a client that keeps up; what waits stays below the
// bounds plus one response.
const (
	maxQueued      = 1 << 16  // responses
	maxQueuedBytes = 64 << 20 // encoded bytes of the events waiting
	// maxMergeBytes and maxMergeSegs bound one merged client response.
	maxMergeBytes = 1 << 20
	maxMergeSegs  = 1000
)

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
}

type upstream struct {
	hub   *watchHub
	key   watchKey
	heard atomic.Int64 // when a response last came, unix nanoseconds

	mu        sync.Mutex
	ctx       context.Context
	cancel    context.CancelFunc
	gen       int // which watch feeds it (restart starts a new one)
	nextrev   int64
	caughtUp  bool
	closed    bool
	receivers map[*cwatcher]struct{}
	// pos.OpenedAt is the revision the current watch started from,
	// pos.Known the highest revision etcd reported on u's watches (or
	// their stream); pos.Next is nextrev, set where pos decides.
	// wantEarly: the next watch starts at Known, below nextrev (see
	// checkSilence).
	pos       etcdwatch.Position
	wantEarly bool
	// fan groups one batch's receivers by client stream (dispatch's
	// scratch, emptied after each batch); free keeps its slices.
	fan  map[*cstream][]fanItem
	free [][]fanItem
}

// fanAdd adds fi for stream s to the batch being dispatched; u.mu held.
func (u *upstream) fanAdd(s *cstream, fi fanItem) {
	if u.fan == nil {
		u.fan = map[*cstream][]fanItem{}
	}
	ws, ok := u.fan[s]
	if !ok && len(u.free) > 0 {
		ws, u.free = u.free[len(u.free)-1], u.free[:len(u.free)-1]
	}
	u.fan[s] = append(ws, fi)
}

// fanOut queues b on every stream fanAdd named, once per stream, and
// empties the scratch; u.mu held, so that batches reach each stream in
// order.
func (u *upstream) fanOut(b *evBatch) {
	for s, ws := range u.fan {
		s.enqueueEvents(b, ws)
		clear(ws)
		if len(u.free) < 64 && cap(ws) <= 4096 {
			u.free = append(u.free, ws[:0])
		}
		delete(u.fan, s)
	}
}

type cwatcher struct {
	id      int64
	idPart  mem.Buffer // the watch ID, encoded (watchIDPart)
	variant int        // filterVariant of its filters
	s       *cstream
	key     watchKey
	progres bool
	nextrev int64       // guarded by up.mu
	up      *upstream   // guarded by hub.mu
	sink    *rangeCache // an internal consumer instead of a client stream (s nil)
}

// qitem is one response waiting for a client stream: a control response
// (created, canceled, progress), or a watcher's events: segments merged
// while they wait, a list through the stream's segment arena.
type qitem struct {
	resp        *pb.WatchResponse
	w           *cwatcher
	first, last int32 // arena indices of its segments
	nsegs       int
	size        int
}

// segNode is a segment in a stream's arena, linked to the next of its
// response (-1: the last).
type segNode struct {
	seg
	next int32
}

// cstream is one client Watch stream.
type cstream struct {
	hub    *watchHub
	ss     grpc.ServerStream
	ctx    context.Context
	cancel context.CancelCauseFunc
	rctx   context.Context // outgoing metadata for the proxy's own calls

	mu       sync.Mutex
	watchers map[int64]*cwatcher
	nextID   int64
	queue    []qitem
	segs     []segNode // the segments of queue's event responses
	spare    []qitem   // the sender's last batch, reused
	spareSeg []segNode
	open     map[int64]int // watch ID -> index in queue of its mergeable events
	qbytes   int
	signal   chan struct{}
	pending  map[*upstream]bool // progress requested, not yet answered
	wantProg bool
	closed   bool // the stream has ended: no new watcher
	overflow bool // the queue overflowed: the stream is being ended
}

func newWatchHub(p *Proxy) *watchHub {
	ctx, cancel := context.WithCancel(context.Background())
	return &watchHub{p: p, ctx: ctx, cancel: cancel, kick: make(chan struct{}, 1),
		probes: map[watchKey]*etcdwatch.Silence{}, groups: map[watchKey][]*upstream{}}
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

// serve handles one client Watch stream.
func (h *watchHub) serve(ss grpc.ServerStream) error {
	rctx, err := h.p.outgoing(ss.Context(), watchMethod)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ss.Context())
	s := &cstream{hub: h, ss: ss, ctx: ctx, cancel: cancel, rctx: rctx,
		watchers: map[int64]*cwatcher{}, open: map[int64]int{}, signal: make(chan struct{}, 1), pending: map[*upstream]bool{}}
	h.p.m.watchStreams.Inc()
	defer h.p.m.watchStreams.Dec()

	// The receive loop ends by itself once this handler has returned
	// (gRPC then fails its RecvMsg); watchers it still creates after that
	// are detached by create itself.
	go func() {
		if err := s.recvLoop(); err != nil && status.Code(err) != codes.Canceled {
			s.cancel(err)
		}
	}()
	sendErr := s.sendLoop()
	cancel(nil)
	s.detachAll()
	s.mu.Lock()
	s.queue, s.segs, s.spare, s.spareSeg, s.open = nil, nil, nil, nil, nil // what waits holds shared batches
	s.mu.Unlock()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) {
		if status.Code(err) == codes.Unknown && ss.Context().Err() != nil {
			return nil
		}
		return err
	}
	return sendErr
}

func (s *cstream) recvLoop() error {
	for {
		req := new(pb.WatchRequest)
		if err := s.ss.RecvMsg(req); err != nil {
			if errors.Is(err, io.EOF) {
				// The client closed its side (the JSON gateway does after
				// the request body): keep sending events, as etcd does.
				return nil
			}
			s.cancel(nil)
			return err
		}
		switch r := req.RequestUnion.(type) {
		case *pb.WatchRequest_CreateRequest:
			if r.CreateRequest != nil {
				s.create(r.CreateRequest)
			}
		case *pb.WatchRequest_CancelRequest:
			if r.CancelRequest != nil {
				s.cancelWatch(r.CancelRequest.WatchId)
			}
		case *pb.WatchRequest_ProgressRequest:
			s.requestProgress()
		}
	}
}

// enqueue adds control responses for the client without blocking. A
// response for one watcher closes that watcher's mergeable events (what
// follows comes after it); a stream-wide one (watch ID -1) closes all.
func (s *cstream) enqueue(rs ...*pb.WatchResponse) {
	s.mu.Lock()
	if s.overflow {
		s.mu.Unlock()
		return
	}
	if s.behindLocked() {
		s.mu.Unlock()
		s.overflowed()
		return
	}
	for _, r := range rs {
		if r.WatchId == clientv3.InvalidWatchID {
			clear(s.open)
		} else {
			delete(s.open, r.WatchId)
		}
		s.queue = append(s.queue, qitem{resp: r})
	}
	s.mu.Unlock()
	s.wake()
}

// behindLocked reports a stream whose waiting responses, not yet taken by
// its sender, are past the bounds; s.mu held. It is asked before a new
// response is queued, so that a stream that has taken everything so far
// accepts the next one whatever its size.
func (s *cstream) behindLocked() bool {
	return len(s.queue) > s.hub.p.watchQueue || s.qbytes > s.hub.p.watchQueueBytes
}

// fanItem is one watcher's share of a batch, from revision from.
type fanItem struct {
	w    *cwatcher
	from int64
}

// enqueueEvents queues batch b's events for each of ws (all watchers of
// s), each merged into its events that already wait when they fit. One
// lock and one wake for all of them: the sender then finds the whole
// batch at once rather than racing the dispatcher for it watcher by
// watcher.
func (s *cstream) enqueueEvents(b *evBatch, ws []fanItem) {
	s.mu.Lock()
	if s.overflow {
		s.mu.Unlock()
		return
	}
	if s.behindLocked() {
		s.mu.Unlock()
		s.overflowed()
		return
	}
	for _, fi := range ws {
		w := fi.w
		n := int32(len(s.segs))
		s.segs = append(s.segs, segNode{seg: seg{b: b, from: fi.from}, next: -1})
		if i, ok := s.open[w.id]; ok && s.queue[i].size+b.size <= maxMergeBytes && s.queue[i].nsegs < maxMergeSegs {
			it := &s.queue[i]
			s.segs[it.last].next = n
			it.last = n
			it.nsegs++
			it.size += b.size
		} else {
			s.queue = append(s.queue, qitem{w: w, first: n, last: n, nsegs: 1, size: b.size})
			s.open[w.id] = len(s.queue) - 1
		}
		s.qbytes += b.size
	}
	s.mu.Unlock()
	s.wake()
}

func (s *cstream) wake() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// overflowed ends a stream that fell too far behind.
func (s *cstream) overflowed() {
	s.mu.Lock()
	if s.overflow {
		s.mu.Unlock()
		return
	}
	s.overflow = true
	s.queue, s.segs, s.open, s.qbytes = nil, nil, map[int64]int{}, 0
	s.mu.Unlock()
	s.hub.p.m.watchDropped.Inc()
	s.cancel(status.Errorf(codes.ResourceExhausted,
		"proxy: watch stream too slow: more than %d responses or %s of events still waiting for it when more came; re-create the watches from the last revision received",
		s.hub.p.watchQueue, byteSize(s.hub.p.watchQueueBytes)))
}

// byteSize formats n bytes in MiB, or KiB below 1 MiB.
func byteSize(n int) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// keepSpare bounds the queue capacity a stream keeps between bursts, so
// that memory goes back to idle after one.
const keepSpare = 1024

func (s *cstream) sendLoop() error {
	m := s.hub.p.m
	for {
		select {
		case <-s.ctx.Done():
			return nil
		case <-s.signal:
		}
		s.mu.Lock()
		batch, segs := s.queue, s.segs
		s.queue, s.segs = s.spare, s.spareSeg
		s.spare, s.spareSeg = nil, nil
		clear(s.open)
		s.qbytes = 0
		s.mu.Unlock()
		events := 0
		for i := range batch {
			it := &batch[i]
			var err error
			if it.resp != nil {
				err = s.ss.SendMsg(it.resp)
			} else if msg, n := splice(it.w, segs, it.first, it.nsegs); msg != nil {
				err = s.ss.SendMsg(msg)
				events += n
			}
			*it = qitem{} // drop the references to shared batches
			if err != nil {
				return err
			}
		}
		clear(segs)
		m.watchEvents.Add(float64(events))
		if cap(batch) <= keepSpare && cap(segs) <= 4*keepSpare {
			s.mu.Lock()
			if s.spare == nil && len(s.queue) == 0 {
				s.spare, s.spareSeg = batch[:0], segs[:0]
			}
			s.mu.Unlock()
		}
	}
}

func watchCanceled(hdr *pb.ResponseHeader, id int64, reason string) *pb.WatchResponse {
	if hdr == nil {
		hdr = &pb.ResponseHeader{}
	}
	return &pb.WatchResponse{Header: hdr, WatchId: id, Created: true, Canceled: true, CancelReason: reason}
}

// create handles a WatchCreateRequest.
func (s *cstream) create(cr *pb.WatchCreateRequest) {
	h := s.hub
	id := cr.WatchId
	s.mu.Lock()
	if id == clientv3.AutoWatchID {
		for s.watchers[s.nextID] != nil {
			s.nextID++
		}
		id = s.nextID
		s.nextID++
	} else if s.watchers[id] != nil {
		s.mu.Unlock()
		s.enqueue(watchCanceled(nil, id, "mvcc: duplicate watch ID"))
		return
	}
	open := len(s.watchers)
	s.mu.Unlock()
	if limit := h.p.cfg.MaxWatchersPerStream; limit > 0 && open >= limit {
		s.enqueue(watchCanceled(nil, id, fmt.Sprintf(
			"proxy: this watch stream has %d watchers, the most one stream may have (--max-watchers-per-stream): cancel watches you no longer need", open)))
		return
	}
	if limit := h.p.cfg.MaxWatchers; limit > 0 && h.watchers.Load() >= int64(limit) {
		s.enqueue(watchCanceled(nil, id, fmt.Sprintf(
			"proxy: %d watchers are open on this proxy, the most it serves (--max-watchers): retry later, or through another proxy", limit)))
		return
	}

	key, end := string(cr.Key), string(cr.RangeEnd)
	if end != "" && end != "\x00" && end <= key {
		s.enqueue(watchCanceled(nil, id, "proxy: invalid watch range: range end must be greater than key"))
		return
	}
	if cr.StartRevision < 0 {
		s.enqueue(watchCanceled(nil, id, rpctypes.ErrCompacted.Error()))
		return
	}
	// A count-only serializable Range checks the client may read the
	// range (with its own token) and gives the current revision.
	rk, re := cr.Key, cr.RangeEnd
	if len(rk) == 0 {
		rk, re = []byte{0}, []byte{0}
	}
	rresp := new(pb.RangeResponse)
	_, _, err := h.p.invoke(s.rctx, kvSvc+"Range", &pb.RangeRequest{Key: rk, RangeEnd: re, Serializable: true, CountOnly: true, Limit: 1},
		rresp, false, true)
	if err != nil {
		s.enqueue(watchCanceled(nil, id, status.Convert(err).Message()))
		return
	}
	md, _ := metadata.FromIncomingContext(s.ss.Context())
	token := strings.Join(append(md.Get(rpctypes.TokenFieldNameGRPC), md.Get("authorization")...), ",")
	if h.p.lendsIdentity(s.ss.Context(), watchMethod) { // anonymous.go
		token = anonymousToken
	}
	w := &cwatcher{id: id, idPart: watchIDPart(id), s: s, progres: cr.ProgressNotify,
		key: watchKey{key: key, end: end, prevKV: cr.PrevKv,
			token:         token,
			via:           strings.Join(md.Get(viaKey), ","),
			requireLeader: slices.Contains(md.Get(rpctypes.MetadataRequireLeaderKey), rpctypes.MetadataHasLeader)}}
	var noPut, noDel bool
	for _, f := range cr.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			noPut = true
		case pb.WatchCreateRequest_NODELETE:
			noDel = true
		}
	}
	w.variant = filterVariant(noPut, noDel)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if s.watchers[id] != nil {
		s.mu.Unlock()
		s.enqueue(watchCanceled(nil, id, "mvcc: duplicate watch ID"))
		return
	}
	s.watchers[id] = w
	s.mu.Unlock()
	h.watcherAdded()
	if !h.attach(w, cr.StartRevision, rresp.Header) {
		h.watcherRemoved()
		s.mu.Lock()
		delete(s.watchers, id)
		s.mu.Unlock()
		s.enqueue(watchCanceled(rresp.Header, id, "proxy: closing"))
		return
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		h.detach(w) // the stream ended while this watcher was being attached
	}
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
// created response before any event.
func (h *watchHub) attach(w *cwatcher, start int64, hdr *pb.ResponseHeader) bool {
	if hdr == nil {
		hdr = &pb.ResponseHeader{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	current := hdr.Revision
	want := start
	if want == 0 {
		want = current + 1
	}
	ups := h.groups[w.key]
	var best *upstream
	for _, u := range ups {
		u.mu.Lock()
		ok := !u.closed && u.nextrev <= want
		u.mu.Unlock()
		if ok {
			best = u
			break
		}
	}
	if best == nil && start == 0 {
		// From now: the most recent upstream also counts as now.
		for _, u := range ups {
			u.mu.Lock()
			if !u.closed && (best == nil || u.nextrev < best.nextrev) {
				best = u
			}
			u.mu.Unlock()
		}
	}
	created := func(u *upstream, next int64) {
		rev := current
		if start == 0 {
			rev = next - 1
		}
		w.nextrev = next
		w.up = u
		w.s.enqueue(&pb.WatchResponse{Header: withRevision(hdr, rev), WatchId: w.id, Created: true})
		u.receivers[w] = struct{}{}
	}
	if best != nil {
		best.mu.Lock()
		created(best, max(want, best.nextrev))
		best.mu.Unlock()
		return true
	}
	u := h.newUpstream(w.key, want, start == 0)
	u.mu.Lock()
	created(u, want)
	u.mu.Unlock()
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
	var u *upstream
	for _, v := range h.groups[w.key] {
		v.mu.Lock()
		if !v.closed && v.nextrev <= rev {
			u = v
		}
		v.mu.Unlock()
	}
	if u == nil {
		u = h.newUpstream(w.key, rev, false)
	}
	u.mu.Lock()
	w.nextrev, w.up = rev, u
	u.receivers[w] = struct{}{}
	u.mu.Unlock()
	return true
}

// newUpstream starts an upstream watch from rev; h.mu is held.
func (h *watchHub) newUpstream(k watchKey, rev int64, current bool) *upstream {
	u := &upstream{hub: h, key: k, nextrev: rev, caughtUp: current, receivers: map[*cwatcher]struct{}{}}
	u.heard.Store(time.Now().UnixNano())
	h.groups[k] = append(h.groups[k], u)
	h.p.m.upstreamWatches.Inc()
	u.mu.Lock()
	u.watchLocked(h.w)
	u.mu.Unlock()
	return u
}

// watchLocked starts the watch that feeds u, on w from u.nextrev; u.mu
// (and h.mu) are held.
func (u *upstream) watchLocked(w clientv3.Watcher) {
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
	// From nextrev, unless checkSilence asked for a watch from the last
	// revision etcd reported (dispatch skips the events below nextrev).
	from := u.nextrev
	if u.wantEarly && u.pos.Known > 0 && u.pos.Known < from {
		from = u.pos.Known
	}
	u.wantEarly, u.pos.OpenedAt = false, from
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

// restart feeds u from a new watch on w (another member), from the first
// revision it has not delivered; h.mu is held. It reports whether u was
// still open.
func (u *upstream) restart(w clientv3.Watcher) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return false
	}
	u.cancel()
	u.heard.Store(time.Now().UnixNano())
	u.watchLocked(w)
	return true
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
	if wr.CompactRevision != 0 && wr.Header != nil && u.retryWithoutMargin(wr.CompactRevision, wr.Header.Revision, gen) {
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
		u.nextrev = max(u.nextrev, hdr.Revision+1)
		u.caughtUp = true
		for w := range u.receivers {
			w.nextrev = max(w.nextrev, hdr.Revision+1)
			if w.sink != nil {
				w.sink.progress(hdr.Revision)
				continue
			}
			if w.progres {
				w.s.enqueue(&pb.WatchResponse{Header: withRevision(hdr, hdr.Revision), WatchId: w.id})
			}
			if w.s.progressDone(u) {
				done = append(done, w.s)
			}
		}
	default:
		if len(wr.Events) == 0 {
			break
		}
		b := newBatch(hdr, wr.Events)
		u.nextrev = max(u.nextrev, b.last+1)
		if hdr.Revision == b.last {
			u.caughtUp = true
		}
		for w := range u.receivers {
			from := w.nextrev
			if from > b.last {
				continue
			}
			w.nextrev = b.last + 1
			if w.sink != nil {
				w.sink.apply(b, from)
				continue
			}
			u.fanAdd(w.s, fanItem{w: w, from: from})
		}
		u.fanOut(b)
		if !u.caughtUp {
			defer u.hub.requestProgress(u.key)
		}
	}
	u.mu.Unlock()
	for _, s := range done {
		s.answerProgress()
	}
}

// retryWithoutMargin restarts u's watch when watch gen opened early (below
// nextrev) and only revisions below nextrev are compacted: nothing a
// receiver needs is gone. It restarts from nextrev when etcd's revision
// (rev, which the compacted response carries) has reached it, and
// otherwise early again from rev, which is not compacted: a watch that
// starts ahead of etcd's revision (from a revision in the future) would
// have its progress requests go unanswered, and the member taken for hung.
func (u *upstream) retryWithoutMargin(compactRev, rev int64, gen int) bool {
	h := u.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	u.mu.Lock()
	u.pos.Next = u.nextrev
	ok := !h.closed && u.gen == gen && !u.closed && u.pos.CompactedBelowNext(compactRev)
	if ok {
		u.pos.Reported(rev)
		u.wantEarly = u.pos.Known < u.nextrev
	}
	u.mu.Unlock()
	return ok && u.restart(h.w)
}

// end cancels every receiver of u (compaction, permission loss, upstream
// failure) and removes u.
func (u *upstream) end(hdr *pb.ResponseHeader, compactRev int64, reason string) {
	h := u.hub
	h.mu.Lock()
	u.mu.Lock()
	already := u.closed
	u.closed = true
	recv := u.receivers
	u.receivers = map[*cwatcher]struct{}{}
	u.mu.Unlock()
	if !already {
		h.removeLocked(u)
	}
	h.mu.Unlock()
	u.stop()
	if hdr == nil {
		hdr = &pb.ResponseHeader{}
	}
	for w := range recv {
		if w.sink != nil {
			w.sink.ended(reason)
			continue
		}
		// w left u.receivers here (a detach after this finds it gone):
		// count it out here, even when its stream already dropped it.
		h.watcherRemoved()
		s := w.s
		s.mu.Lock()
		if s.watchers[w.id] == w {
			delete(s.watchers, w.id)
		}
		s.mu.Unlock()
		s.enqueue(&pb.WatchResponse{Header: withRevision(hdr, hdr.Revision), WatchId: w.id, Canceled: true, CompactRevision: compactRev, CancelReason: reason})
		if s.progressDone(u) {
			s.answerProgress()
		}
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
	if len(ups) < 2 {
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

// moveLocked moves every receiver of from to to, if to is caught up and
// not ahead of from; h.mu is held.
func (h *watchHub) moveLocked(from, to *upstream) bool {
	from.mu.Lock()
	to.mu.Lock()
	ok := !from.closed && !to.closed && to.caughtUp && to.nextrev <= from.nextrev
	if ok {
		for w := range from.receivers {
			to.receivers[w] = struct{}{}
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
		from.receivers = map[*cwatcher]struct{}{}
		from.closed = true
	}
	to.mu.Unlock()
	from.mu.Unlock()
	if ok {
		h.removeLocked(from)
		from.stop()
	}
	return ok
}

// cancelWatch handles a client's WatchCancelRequest.
func (s *cstream) cancelWatch(id int64) {
	s.mu.Lock()
	w := s.watchers[id]
	delete(s.watchers, id)
	s.mu.Unlock()
	if w == nil {
		return
	}
	s.hub.detach(w)
	s.enqueue(&pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: id, Canceled: true})
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
	_, was := u.receivers[w]
	delete(u.receivers, w)
	empty := len(u.receivers) == 0 && !u.closed
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

func (s *cstream) detachAll() {
	s.mu.Lock()
	s.closed = true
	ws := make([]*cwatcher, 0, len(s.watchers))
	for _, w := range s.watchers {
		ws = append(ws, w)
	}
	s.watchers = map[int64]*cwatcher{}
	s.mu.Unlock()
	for _, w := range ws {
		s.hub.detach(w)
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

// requestProgress handles a client's WatchProgressRequest: once every
// upstream feeding this stream has reported progress, the client gets a
// progress notification (watch ID -1) at the lowest revision all its
// watchers have fully received.
func (s *cstream) requestProgress() {
	h := s.hub
	h.mu.Lock()
	s.mu.Lock()
	ups := map[*upstream]bool{}
	for _, w := range s.watchers {
		if w.up != nil {
			ups[w.up] = true
		}
	}
	s.pending = maps.Clone(ups)
	s.wantProg = len(ups) > 0
	s.mu.Unlock()
	keys := map[watchKey]bool{}
	for u := range ups {
		keys[u.key.group()] = true
	}
	w := h.w
	h.mu.Unlock()
	if len(ups) == 0 {
		// No watcher: answer with the current revision.
		rresp := new(pb.RangeResponse)
		if _, _, err := h.p.invoke(s.rctx, kvSvc+"Range", &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Serializable: true, CountOnly: true, Limit: 1},
			rresp, false, true); err == nil {
			s.enqueue(&pb.WatchResponse{Header: rresp.Header, WatchId: clientv3.InvalidWatchID})
		}
		return
	}
	for u := range ups {
		if keys[u.key.group()] {
			delete(keys, u.key.group())
			_ = w.RequestProgress(u.context())
		}
	}
}

// progressDone records that u reported progress; it reports whether the
// client's progress request is now complete.
func (s *cstream) progressDone(u *upstream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.wantProg || !s.pending[u] {
		return false
	}
	delete(s.pending, u)
	if len(s.pending) == 0 {
		s.wantProg = false
		return true
	}
	return false
}

// answerProgress sends the progress notification for a completed request.
func (s *cstream) answerProgress() {
	h := s.hub
	h.mu.Lock()
	s.mu.Lock()
	ws := make([]*cwatcher, 0, len(s.watchers))
	for _, w := range s.watchers {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	var rev int64 = -1
	for _, w := range ws {
		if u := w.up; u != nil {
			u.mu.Lock()
			if r := w.nextrev - 1; rev < 0 || r < rev {
				rev = r
			}
			u.mu.Unlock()
		}
	}
	h.mu.Unlock()
	if rev < 0 {
		return
	}
	s.enqueue(&pb.WatchResponse{Header: &pb.ResponseHeader{Revision: rev}, WatchId: clientv3.InvalidWatchID})
}

// withRevision copies a response header with another revision.
func withRevision(h *pb.ResponseHeader, rev int64) *pb.ResponseHeader {
	if h == nil {
		return &pb.ResponseHeader{Revision: rev}
	}
	return &pb.ResponseHeader{ClusterId: h.ClusterId, MemberId: h.MemberId, Revision: rev, RaftTerm: h.RaftTerm}
}
