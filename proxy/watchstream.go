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

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

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
	maxQueued      = 1 << 16  // items: control responses, and upstream responses for the stream's watchers
	maxQueuedBytes = 64 << 20 // encoded bytes of the events waiting, once per watcher they are for
	// maxMergeBytes and maxMergeSegs bound one merged client response.
	maxMergeBytes = 1 << 20
	maxMergeSegs  = 1000
)

// qitem is what waits for a client stream: a control response (created,
// canceled, progress), or an upstream response's events for some of the
// stream's watchers, each from its own revision (fanOut's list), with the
// version of the upstream's list they are (0: a share of one).
type qitem struct {
	resp *pb.WatchResponse
	b    *evBatch
	fan  []fanItem
	ver  uint64
}

// cstream is one client Watch stream: its watchers, and the responses
// waiting for its sender. Lock order: cstream.mu is innermost (taken
// after watchHub.mu, upstream.mu and the waitState's locks, never before
// them).
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
	spare    []qitem // the sender's last batch, reused
	sending  []qitem // the batch the sender writes, until it lets go of its batches
	qbytes   int
	since    uint64 // evBatch.seq of the oldest batch s holds, queued or sending (0: none)
	signal   chan struct{}
	pending  map[*upstream]bool // progress requested, not yet answered
	wantProg bool
	closed   bool // the stream has ended: no new watcher, nothing queued
	overflow bool // the stream is being ended (too slow, or shed): nothing queued
}

// newCStream is the state of client stream ss, ended by cancel; rctx
// carries its outgoing metadata.
func newCStream(ctx, rctx context.Context, cancel context.CancelCauseFunc, h *watchHub, ss grpc.ServerStream) *cstream {
	return &cstream{hub: h, ss: ss, ctx: ctx, cancel: cancel, rctx: rctx,
		watchers: map[int64]*cwatcher{}, signal: make(chan struct{}, 1), pending: map[*upstream]bool{}}
}

// serve handles one client Watch stream.
func (h *watchHub) serve(ss grpc.ServerStream) error {
	rctx, err := h.p.outgoing(ss.Context(), watchMethod)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ss.Context())
	s := newCStream(ctx, rctx, cancel, h, ss)
	h.p.m.watchStreams.Inc()
	defer h.p.m.watchStreams.Dec()
	h.addStream(s)
	defer h.removeStream(s)

	// The receive loop ends by itself once this handler has returned
	// (gRPC then fails its RecvMsg); a watcher it still creates after
	// detachAll is refused by attach.
	go func() {
		if err := s.recvLoop(); err != nil && status.Code(err) != codes.Canceled {
			s.cancel(err)
		}
	}()
	sendErr := sendAside(ctx, &h.wg, s.sendLoop)
	cancel(nil)
	s.detachAll() // nothing holds s once its receive loop ends: what still waits for it is let go
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

// enqueue adds control responses for the client without blocking.
func (s *cstream) enqueue(rs ...*pb.WatchResponse) {
	if !s.lockToQueue() {
		return
	}
	for _, r := range rs {
		s.queue = append(s.queue, qitem{resp: r})
	}
	s.mu.Unlock()
	s.wake()
}

// lockToQueue locks s.mu to queue a response, unless the stream has
// ended or is being ended, or is behind (it is then ended): it reports
// whether s.mu is held.
func (s *cstream) lockToQueue() bool {
	s.mu.Lock()
	if s.overflow || s.closed {
		s.mu.Unlock()
		return false
	}
	if s.behindLocked() {
		s.mu.Unlock()
		s.overflowed()
		return false
	}
	return true
}

// behindLocked reports a stream whose waiting responses, not yet taken by
// its sender, are past the bounds; s.mu held. It is asked before a new
// response is queued, so that a stream that has taken everything so far
// accepts the next one whatever its size.
func (s *cstream) behindLocked() bool {
	return len(s.queue) > s.hub.p.watchQueue || s.qbytes > s.hub.p.watchQueueBytes
}

// enqueueEvents queues batch b's events for the watchers of fan (from
// fanOut, which the stream now owns; ver its list's version). One lock
// and one wake for all of them: the sender then finds the whole batch at
// once rather than racing the dispatcher for it watcher by watcher. If
// b takes what waits for all streams past the proxy's bound, the streams
// that have waited longest are ended (watchwait.go).
func (s *cstream) enqueueEvents(b *evBatch, fan []fanItem, ver uint64) {
	if !s.lockToQueue() {
		putFan(fan)
		return
	}
	h := s.hub
	s.queue = append(s.queue, qitem{b: b, fan: fan, ver: ver})
	s.qbytes += b.size * len(fan)
	if s.since == 0 {
		s.since = b.seq
	}
	h.hold(b)
	s.mu.Unlock()
	s.wake()
	if h.overWaiting() {
		h.shed(b)
	}
}

func (s *cstream) wake() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// overflowed ends a stream that fell too far behind.
func (s *cstream) overflowed() {
	if s.end(status.Errorf(codes.ResourceExhausted,
		"proxy: watch stream too slow: more than %d responses or %s of events still waiting for it when more came; re-create the watches from the last revision received",
		s.hub.p.watchQueue, byteSize(s.hub.p.watchQueueBytes))) {
		s.hub.p.m.watchDropped.Inc()
	}
}

// end ends s with err and lets go of what waits for it; it reports
// whether s was not being ended already.
func (s *cstream) end(err error) bool {
	s.mu.Lock()
	if s.overflow {
		s.mu.Unlock()
		return false
	}
	s.overflow = true
	s.dropLocked()
	s.mu.Unlock()
	s.cancel(err)
	return true
}

// dropLocked lets go of every batch s holds, queued or being sent (its
// sender then has nothing to let go of); s.mu held.
func (s *cstream) dropLocked() {
	s.hub.release(s.queue)
	s.hub.release(s.sending)
	s.queue, s.sending, s.qbytes, s.since = nil, nil, 0, 0
}

// firstSeq is the evBatch.seq of the first batch in items (0: none).
func firstSeq(items []qitem) uint64 {
	for _, it := range items {
		if it.b != nil {
			return it.b.seq
		}
	}
	return 0
}

// byteSize formats n bytes in MiB, or KiB below 1 MiB.
func byteSize(n int) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// keepSpare bounds the queue capacity a stream keeps between bursts, so
// that memory goes back to idle after one. The spare queue's gain,
// BenchmarkDispatch with and without it (reuse=all vs nospare, 6
// alternating runs of 1000 responses, 2 shared cores): 34% fewer bytes
// per response at 1000 watchers (93 KB vs 141 KB), 3% at 100; time: 4.5%
// faster at 100 watchers (median 22.3 µs vs 23.3 µs, 6 of 6 runs), within
// the noise at 1000 (208 µs vs 201 µs, 4 of 6 runs faster).
const keepSpare = 1024

func (s *cstream) sendLoop() error {
	var sn sender
	for {
		select {
		case <-s.ctx.Done():
			return nil
		case <-s.signal:
		}
		if err := s.flush(&sn); err != nil {
			return err
		}
	}
}

// flush takes what waits for s, sends it, and lets go of its batches.
func (s *cstream) flush(sn *sender) error {
	s.mu.Lock()
	batch := s.queue
	s.queue, s.spare = s.spare, nil
	s.sending, s.qbytes = batch, 0
	s.mu.Unlock()
	err := sn.send(s.ss, batch)
	s.mu.Lock()
	s.hub.release(s.sending) // nil if end let go of it meanwhile
	s.sending = nil
	s.since = firstSeq(s.queue)
	clear(batch) // drop the references to shared batches
	if err == nil && cap(batch) <= keepSpare && s.spare == nil && len(s.queue) == 0 {
		s.spare = batch[:0]
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.hub.p.m.watchEvents.Add(float64(sn.events))
	return nil
}

// sender writes what waited for a stream; its scratch is reused from one
// batch to the next.
type sender struct {
	sp     spliced // filled for each response, marshaled by SendMsg
	segs   []seg
	runs   []run          // sendRuns' groups
	open   map[uint64]int // sendRuns: list version -> its group still open
	events int            // events sent by the last send
}

// run is events queued for the same watchers, sent as one response each.
type run struct {
	items []qitem
	size  int // encoded bytes of one watcher's share, at most
}

// send writes batch in order. Between two control responses, the events
// queued for the same version of an upstream's list of watchers are
// merged, per watcher, into one response of at most maxMergeSegs upstream
// responses and about maxMergeBytes, as etcd's own watch server does: a
// stream that lags gets fewer, larger messages instead of falling further
// behind, whatever else its other watchers' upstreams queued between.
// Nothing is merged across a control response, so that none is
// overtaken. Every list of watchers is given back (putFan), sent or not.
func (sn *sender) send(ss grpc.ServerStream, batch []qitem) error {
	sn.events = 0
	var err error
	for i := 0; i < len(batch); {
		if batch[i].resp != nil {
			if err == nil {
				err = ss.SendMsg(batch[i].resp)
			}
			i++
			continue
		}
		j := i + 1
		for j < len(batch) && batch[j].resp == nil {
			j++
		}
		if err == nil {
			err = sn.sendRuns(ss, batch[i:j])
		}
		for k := i; k < j; k++ {
			putFan(batch[k].fan)
		}
		i = j
	}
	return err
}

// sendRuns groups items (events, no control response) by list version
// into runs within the bounds of one merged response, and sends the runs
// in the order they began. A watcher still gets its events in order: it
// is on one upstream's list at a time (the one it moved from is closed),
// a list's version changes with every change of its watchers and is never
// used again, and a share of a list (version 0) comes only after the list
// changed (a watcher joined or moved in ahead of the upstream) and before
// its new version's first whole batch: so a watcher's items of one
// version all come before its items of any later group.
func (sn *sender) sendRuns(ss grpc.ServerStream, items []qitem) error {
	if sn.open == nil {
		sn.open = map[uint64]int{}
	}
	defer func() {
		clear(sn.open)
		clear(sn.runs)
		sn.runs = sn.runs[:0]
	}()
	for _, it := range items {
		if g, ok := sn.open[it.ver]; ok && it.ver != 0 {
			if r := &sn.runs[g]; len(r.items) < maxMergeSegs && r.size+it.b.size <= maxMergeBytes {
				r.items = append(r.items, it)
				r.size += it.b.size
				continue
			}
		}
		sn.open[it.ver] = len(sn.runs)
		sn.runs = append(sn.runs, run{items: []qitem{it}, size: it.b.size})
	}
	for _, r := range sn.runs {
		if err := sn.sendRun(ss, r.items); err != nil {
			return err
		}
	}
	return nil
}

// sendRun sends each watcher of run (items for the same watchers) one
// response with its events of every item.
func (sn *sender) sendRun(ss grpc.ServerStream, run []qitem) error {
	for k, fi := range run[0].fan {
		sn.segs = sn.segs[:0]
		for _, it := range run {
			sn.segs = append(sn.segs, seg{b: it.b, from: it.fan[k].from})
		}
		n := splice(&sn.sp, fi.id, fi.variant, sn.segs)
		if n == 0 {
			continue
		}
		err := ss.SendMsg(&sn.sp)
		sn.sp.data = nil
		if err != nil {
			return err
		}
		sn.events += n
	}
	clear(sn.segs)
	return nil
}

func watchCanceled(hdr *pb.ResponseHeader, id int64, reason string) *pb.WatchResponse {
	if hdr == nil {
		hdr = &pb.ResponseHeader{}
	}
	return &pb.WatchResponse{Header: hdr, WatchId: id, Created: true, Canceled: true, CancelReason: reason}
}

// create handles a WatchCreateRequest: a watcher is refused (a canceled
// response saying why), or attached to an upstream.
func (s *cstream) create(cr *pb.WatchCreateRequest) {
	h := s.hub
	id, reason := s.admit(cr)
	if reason != "" {
		s.enqueue(watchCanceled(nil, id, reason))
		return
	}
	rresp, err := h.p.mayWatch(s.rctx, cr.Key, cr.RangeEnd)
	if err != nil {
		s.enqueue(watchCanceled(nil, id, status.Convert(err).Message()))
		return
	}
	s.add(s.newWatcher(id, cr), cr.StartRevision, rresp.Header)
}

// add registers w on s and attaches it from revision start (0: from now;
// hdr is the header of create's Range, at the current revision). A
// watcher whose ID is taken, or that the hub refuses (the proxy or s is
// closing), gets a canceled response instead.
func (s *cstream) add(w *cwatcher, start int64, hdr *pb.ResponseHeader) {
	h := s.hub
	s.mu.Lock()
	if s.watchers[w.id] != nil {
		s.mu.Unlock()
		s.enqueue(watchCanceled(nil, w.id, "mvcc: duplicate watch ID"))
		return
	}
	s.watchers[w.id] = w
	s.mu.Unlock()
	h.watcherAdded()
	if !h.attach(w, start, hdr) {
		h.watcherRemoved()
		s.mu.Lock()
		delete(s.watchers, w.id)
		s.mu.Unlock()
		s.enqueue(watchCanceled(hdr, w.id, "proxy: closing"))
	}
}

// admit chooses the watch ID of cr and checks what needs no etcd: a
// non-empty reason refuses it.
func (s *cstream) admit(cr *pb.WatchCreateRequest) (id int64, reason string) {
	h := s.hub
	id = cr.WatchId
	s.mu.Lock()
	if id == clientv3.AutoWatchID {
		for s.watchers[s.nextID] != nil {
			s.nextID++
		}
		id = s.nextID
		s.nextID++
	} else if s.watchers[id] != nil {
		s.mu.Unlock()
		return id, "mvcc: duplicate watch ID"
	}
	open := len(s.watchers)
	s.mu.Unlock()
	if limit := h.p.cfg.MaxWatchersPerStream; limit > 0 && open >= limit {
		return id, fmt.Sprintf(
			"proxy: this watch stream has %d watchers, the most one stream may have (%s): cancel watches you no longer need", open, h.p.cfg.setting("proxy.Config.MaxWatchersPerStream"))
	}
	if limit := h.p.cfg.MaxWatchers; limit > 0 && h.watchers.Load() >= int64(limit) {
		return id, fmt.Sprintf(
			"proxy: %d watchers are open on this proxy, the most it serves (%s): retry later, or through another proxy", limit, h.p.cfg.setting("proxy.Config.MaxWatchers"))
	}
	key, end := string(cr.Key), string(cr.RangeEnd)
	if end != "" && end != "\x00" && end <= key {
		return id, "proxy: invalid watch range: range end must be greater than key"
	}
	if cr.StartRevision < 0 {
		return id, rpctypes.ErrCompacted.Error()
	}
	return id, ""
}

// newWatcher is the watcher cr asks for, keyed by its range, options and
// the client's credentials.
func (s *cstream) newWatcher(id int64, cr *pb.WatchCreateRequest) *cwatcher {
	md, _ := metadata.FromIncomingContext(s.ss.Context())
	token := strings.Join(append(md.Get(rpctypes.TokenFieldNameGRPC), md.Get("authorization")...), ",")
	if s.hub.p.lendsIdentity(s.ss.Context(), watchMethod) { // anonymous.go
		token = anonymousToken
	}
	w := &cwatcher{id: id, s: s, progres: cr.ProgressNotify,
		key: watchKey{key: string(cr.Key), end: string(cr.RangeEnd), prevKV: cr.PrevKv,
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
	return w
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

// upstreamEnded cancels w, whose upstream u ended: the client gets resp
// (canceled) unless w is no longer the stream's: the client cancelled it
// (and got its canceled response from cancelWatch; it may have created
// another watcher with the same ID since), or the stream ended. A
// progress request waiting on u waits no more.
func (s *cstream) upstreamEnded(w *cwatcher, u *upstream, resp *pb.WatchResponse) {
	s.mu.Lock()
	ours := s.watchers[w.id] == w
	if ours {
		delete(s.watchers, w.id)
	}
	s.mu.Unlock()
	if ours {
		s.enqueue(resp)
	}
	if s.progressDone(u) {
		s.answerProgress()
	}
}

// detachAll ends s: no watcher is attached to it from now on (attach
// asks ended), and those it has are detached.
func (s *cstream) detachAll() {
	s.mu.Lock()
	s.closed = true
	s.dropLocked()
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

// ended reports whether s has ended (detachAll).
func (s *cstream) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
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
		if rresp, err := h.p.mayWatch(s.rctx, nil, nil); err == nil {
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
	if !s.wantProg {
		return false
	}
	delete(s.pending, u) // one not pending leaves as many pending
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
			if u.recv.has(w) {
				if r := u.recv.nextrev(w) - 1; rev < 0 || r < rev {
					rev = r
				}
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

// sendAside runs send, the loop that writes to a client stream, on a
// goroutine that wg owns (its hub's or lease mux's, which waits for it
// when it closes, after the servers stopped), and returns send's error, or
// nil as soon as ctx ends, whichever comes first. A SendMsg blocked on a
// client that stopped reading (its flow-control window full) returns only
// when the stream ends, and the stream ends only when its handler returns:
// a handler that waited for its sender would keep a stream it ended as too
// slow — its watchers, what waits for them, its place among the streams —
// for as long as the connection lives. gRPC cancels the stream when the
// handler returns, which unblocks SendMsg.
func sendAside(ctx context.Context, wg *sync.WaitGroup, send func() error) error {
	done := make(chan error, 1)
	wg.Go(func() { done <- send() })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return nil
	}
}
