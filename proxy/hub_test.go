package proxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/gate"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// The hub's invariants, tested in memory: memEtcd stands for etcd's
// watch API (a history of revisions, and watches the test advances step
// by step), so that a test chooses every interleaving of watch creations,
// cancels and upstream responses. The oracle is the history itself: a
// client watcher must receive exactly the events of its range and filters
// from its start revision, in order, none lost or repeated — computed
// here from the history, not by the hub's code. The end-to-end behaviour
// against a real etcd is in watch_test.go.

// memEvent is the event at revision index+1 of memEtcd's history.
type memEvent struct {
	key string
	del bool
}

// memEtcd is an in-memory history behind a clientv3.Watcher.
type memEtcd struct {
	mu      sync.Mutex
	hist    []memEvent
	watches []*memWatch
	changed *changes     // fired when the hub opens a watch or asks for progress
	asked   atomic.Int64 // progress requests
}

// changes wakes the test's waits when something they wait for may have
// happened (the hub opened an upstream watch, or sent a client a
// response), so that they wait on events rather than on a clock.
type changes struct {
	mu sync.Mutex
	ch chan struct{}
}

func newChanges() *changes { return &changes{ch: make(chan struct{})} }

func (c *changes) fire() {
	c.mu.Lock()
	close(c.ch)
	c.ch = make(chan struct{})
	c.mu.Unlock()
}

// next is closed at the next fire: take it before looking, then wait on it.
func (c *changes) next() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

// waitChange waits for c's next fire (wake, taken before looking) until
// deadline, and reports false if the deadline came first.
func waitChange(wake <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-wake:
		return true
	case <-t.C:
		return false
	}
}

// memWatch is one upstream watch the hub opened on memEtcd.
type memWatch struct {
	key, end string
	ctx      context.Context
	ch       chan clientv3.WatchResponse

	mu      sync.Mutex // held while sending; ch is closed under it
	next    int64      // the next revision it will consider
	created bool
	done    bool
}

func (m *memEtcd) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	op := clientv3.OpGet(key, opts...)
	w := &memWatch{key: key, end: string(op.RangeBytes()), ctx: ctx, ch: make(chan clientv3.WatchResponse), next: op.Rev()}
	m.mu.Lock()
	if w.next == 0 {
		w.next = int64(len(m.hist)) + 1
	}
	m.watches = append(m.watches, w)
	m.mu.Unlock()
	m.changed.fire()
	go func() {
		<-ctx.Done()
		w.mu.Lock()
		w.done = true
		close(w.ch)
		w.mu.Unlock()
	}()
	return w.ch
}

// watchAt waits for the hub to open its i-th upstream watch (0-based).
func (m *memEtcd) watchAt(t *testing.T, i int) *memWatch {
	deadline := time.Now().Add(hubTimeout)
	for {
		wake := m.changed.next()
		m.mu.Lock()
		n := len(m.watches)
		if n > i {
			w := m.watches[i]
			m.mu.Unlock()
			return w
		}
		m.mu.Unlock()
		if !waitChange(wake, deadline) {
			t.Fatalf("the hub opened %d upstream watches, want %d", n, i+1)
		}
	}
}

func (m *memEtcd) RequestProgress(context.Context) error {
	m.asked.Add(1)
	m.changed.fire()
	return nil
}
func (m *memEtcd) Close() error { return nil }

func (m *memEtcd) head() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.hist))
}

func (m *memEtcd) write(key string, del bool) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hist = append(m.hist, memEvent{key: key, del: del})
	return int64(len(m.hist))
}

// open lists the watches not cancelled.
func (m *memEtcd) open() []*memWatch {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ws []*memWatch
	for _, w := range m.watches {
		w.mu.Lock()
		if !w.done {
			ws = append(ws, w)
		}
		w.mu.Unlock()
	}
	return ws
}

// inRange is etcd's range rule: end "" is key alone, "\x00" every key
// from key on.
func inRange(k, key, end string) bool {
	switch end {
	case "":
		return k == key
	case "\x00":
		return k >= key
	}
	return k >= key && k < end
}

// step sends w its next response: created first, then up to max events
// of its range, then a progress notification once it has them all. It
// reports whether w had anything left to send (false: synced, progress
// sent).
func (m *memEtcd) step(w *memWatch, maxEvents int) bool {
	m.mu.Lock()
	head := int64(len(m.hist))
	var evs []*clientv3.Event
	next := w.next
	for r := w.next; r <= head && len(evs) < maxEvents; r++ {
		e := m.hist[r-1]
		next = r + 1
		if !inRange(e.key, w.key, w.end) {
			continue
		}
		ev := &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(e.key), Value: []byte(fmt.Sprint(r)), ModRevision: r}}
		if e.del {
			ev.Type = mvccpb.DELETE
			ev.Kv.Value = nil
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 {
		next = max(w.next, head+1)
	}
	m.mu.Unlock()
	hdr := &pb.ResponseHeader{Revision: head}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return false
	}
	var wr clientv3.WatchResponse
	switch {
	case !w.created:
		wr = clientv3.WatchResponse{Header: hdr, Created: true}
	case len(evs) > 0:
		wr = clientv3.WatchResponse{Header: hdr, Events: evs}
	default:
		wr = clientv3.WatchResponse{Header: hdr} // progress notification
	}
	select {
	case w.ch <- wr:
	case <-w.ctx.Done():
		return false
	}
	if !w.created {
		w.created = true
		return true
	}
	w.next = next
	return len(evs) > 0
}

// recStream is a client Watch stream that records what the proxy sends,
// decoded by protobuf (not by the proxy's splicing).
type recStream struct {
	grpc.ServerStream
	ctx     context.Context
	changed *changes // fired at each response
	mu      sync.Mutex
	got     map[int64][]*pb.WatchResponse
	// held makes the stream's sender wait at its next response until
	// released, as a client that stops reading does: what comes
	// meanwhile queues, and the sender later takes it as one batch
	// (merging).
	held gate.Gate
}

func (r *recStream) Context() context.Context { return r.ctx }

func (r *recStream) SendMsg(m any) error {
	if err := r.held.Wait(r.ctx); err != nil {
		return err
	}
	data, err := newCodec().Marshal(m)
	if err != nil {
		return err
	}
	resp := new(pb.WatchResponse)
	if err := proto.Unmarshal(data.Materialize(), resp); err != nil {
		return err
	}
	r.mu.Lock()
	r.got[resp.WatchId] = append(r.got[resp.WatchId], resp)
	r.mu.Unlock()
	r.changed.fire()
	return nil
}

// responses returns what watch id received so far.
func (r *recStream) responses(id int64) []*pb.WatchResponse {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got[id])
}

// hubRig is a hub on memEtcd with client streams.
type hubRig struct {
	t       *testing.T
	changed *changes // the hub opened a watch or sent a response
	h       *watchHub
	etcd    *memEtcd
	streams []*cstream
	recs    []*recStream
	nextID  int64
	models  []*modelWatcher
	ups     map[*upstream]bool // every upstream a watcher was attached to
	wg      sync.WaitGroup
}

// modelWatcher is what the test knows of one client watcher.
type modelWatcher struct {
	w          *cwatcher
	rec        *recStream
	key, end   string
	noPut      bool
	noDel      bool
	start      int64 // as requested (0: from now)
	current    int64 // the current revision create's Range gave (maybe behind)
	createdRev int64 // the head when it was created
	canceled   bool
}

func newHubRig(t *testing.T, streams int) *hubRig {
	p, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	changed := newChanges()
	r := &hubRig{t: t, h: newWatchHub(p), etcd: &memEtcd{changed: changed}, changed: changed, ups: map[*upstream]bool{}}
	r.h.w = r.etcd
	ctx, cancel := context.WithCancel(context.Background())
	for range streams {
		rec := &recStream{ctx: ctx, changed: changed, got: map[int64][]*pb.WatchResponse{}}
		cctx, ccancel := context.WithCancelCause(ctx)
		s := newCStream(cctx, ctx, ccancel, r.h, rec)
		r.h.addStream(s) // as serve does
		r.streams = append(r.streams, s)
		r.recs = append(r.recs, rec)
		r.wg.Go(func() { _ = s.sendLoop() })
	}
	t.Cleanup(func() {
		cancel()
		r.wg.Wait()
		r.h.close()
	})
	return r
}

// watch creates a client watcher on stream si, as cstream.create does
// once the range is checked and the current revision known.
func (r *hubRig) watch(si int, key, end string, start int64, noPut, noDel bool) *modelWatcher {
	return r.watchBehind(si, key, end, start, noPut, noDel, 0)
}

// watchBehind is watch with create's Range answered lag revisions behind
// etcd's head (a serializable read on a member behind the one the
// upstream watches run on).
func (r *hubRig) watchBehind(si int, key, end string, start int64, noPut, noDel bool, lag int64) *modelWatcher {
	s := r.streams[si]
	id := r.nextID
	r.nextID++
	w := &cwatcher{id: id, s: s, key: watchKey{key: key, end: end}, variant: filterVariant(noPut, noDel)}
	head := r.etcd.head()
	current := max(head-lag, 0)
	s.add(w, start, &pb.ResponseHeader{Revision: current})
	r.h.mu.Lock()
	up := w.up
	r.ups[up] = true
	r.h.mu.Unlock()
	if up == nil {
		r.t.Fatal("attach refused")
	}
	m := &modelWatcher{w: w, rec: r.recs[si], key: key, end: end, noPut: noPut, noDel: noDel, start: start, current: current, createdRev: head}
	r.models = append(r.models, m)
	return m
}

func (r *hubRig) cancel(m *modelWatcher) {
	m.canceled = true
	m.w.s.cancelWatch(m.w.id)
}

// want is the oracle: the revisions m must receive, from the history.
// A watcher from now gets every event after the revision its created
// response names (etcd's contract), which must lie between the current
// revision create was given and etcd's head then.
func (r *hubRig) want(m *modelWatcher) []int64 {
	from := m.start
	if from == 0 {
		resps := m.rec.responses(m.w.id)
		if len(resps) == 0 {
			return nil // not yet created: got() has nothing either
		}
		created := resps[0].Header.GetRevision()
		if created < m.current || created > m.createdRev {
			r.t.Fatalf("watch %d from now: created at revision %d, want between %d (create's current revision) and %d (etcd's then)", m.w.id, created, m.current, m.createdRev)
		}
		from = created + 1
	}
	r.etcd.mu.Lock()
	defer r.etcd.mu.Unlock()
	var revs []int64
	for i, e := range r.etcd.hist {
		rev := int64(i + 1)
		if rev < from || !inRange(e.key, m.key, m.end) || (e.del && m.noDel) || (!e.del && m.noPut) {
			continue
		}
		revs = append(revs, rev)
	}
	return revs
}

// got is the revisions m received, checking that its created response
// came first and nothing came after a cancel.
func (r *hubRig) got(m *modelWatcher) []int64 {
	var revs []int64
	resps := m.rec.responses(m.w.id)
	for i, resp := range resps {
		if (i == 0) != resp.Created {
			r.t.Fatalf("watch %d: response %d created=%v: the created response comes first, once", m.w.id, i, resp.Created)
		}
		if resp.Canceled && i != len(resps)-1 {
			r.t.Fatalf("watch %d: a response after its cancel", m.w.id)
		}
		for _, ev := range resp.Events {
			if string(ev.Kv.Key) == "" || ev.Kv.ModRevision == 0 {
				r.t.Fatalf("watch %d: event without key or revision: %v", m.w.id, ev)
			}
			if ev.Type == mvccpb.PUT && string(ev.Kv.Value) != fmt.Sprint(ev.Kv.ModRevision) {
				r.t.Fatalf("watch %d: event %d carries value %q", m.w.id, ev.Kv.ModRevision, ev.Kv.Value)
			}
			revs = append(revs, ev.Kv.ModRevision)
		}
	}
	return revs
}

// settle delivers every open upstream watch's history and progress
// until all are synced and every client watcher not cancelled has what it
// must receive. (The hub opens an upstream watch from a goroutine: one
// may appear while settling.)
func (r *hubRig) settle() {
	deadline := time.Now().Add(hubTimeout)
	beat := time.NewTicker(5 * time.Millisecond)
	defer beat.Stop()
	for {
		wake := r.changed.next()
		busy := false
		for _, w := range r.etcd.open() {
			if r.etcd.step(w, 1000) {
				busy = true
			}
		}
		if !busy && r.delivered() {
			return
		}
		if time.Now().After(deadline) {
			for _, m := range r.models {
				if want, got := r.want(m), r.got(m); !m.canceled && len(got) < len(want) {
					r.t.Fatalf("watch %d (%q..%q from %d, created at %d): got %v, want %v after %v\n%s", m.w.id, m.key, m.end, m.start, m.createdRev, got, want, hubTimeout, r.describe(m))
				}
			}
			r.t.Fatalf("the upstream watches did not settle within %v", hubTimeout)
		}
		// Wait for the hub to answer (a response, or a watch opened);
		// failing that, for the next beat of the fake etcd, which sends
		// each synced watch a progress notification as etcd does.
		select {
		case <-wake:
		case <-beat.C:
		}
	}
}

// describe says what m received, response by response, and where the
// hub and memEtcd stand for it: for a failure's message.
func (r *hubRig) describe(m *modelWatcher) string {
	var b strings.Builder
	for i, resp := range m.rec.responses(m.w.id) {
		var revs []int64
		for _, ev := range resp.Events {
			revs = append(revs, ev.Kv.ModRevision)
		}
		fmt.Fprintf(&b, "response %d: header %d created %v canceled %v events %v\n", i, resp.Header.GetRevision(), resp.Created, resp.Canceled, revs)
	}
	r.h.mu.Lock()
	u := m.w.up
	if u != nil {
		u.mu.Lock()
		nextrev := int64(-1)
		if u.recv.has(m.w) {
			nextrev = u.recv.nextrev(m.w)
		}
		fmt.Fprintf(&b, "upstream %p: closed %v caught up %v position %+v gen %d receivers %d; the watcher's next revision %d, variant %d\n",
			u, u.closed, u.caughtUp, u.pos, u.gen, u.recv.n, nextrev, m.w.variant)
		u.mu.Unlock()
	}
	for k, ups := range r.h.groups {
		for _, v := range ups {
			v.mu.Lock()
			fmt.Fprintf(&b, "group %q..%q: upstream %p position %+v caught up %v receivers %d\n", k.key, k.end, v, v.pos, v.caughtUp, v.recv.n)
			v.mu.Unlock()
		}
	}
	r.h.mu.Unlock()
	r.etcd.mu.Lock()
	for i, w := range r.etcd.watches {
		w.mu.Lock()
		fmt.Fprintf(&b, "etcd watch %d: %q..%q next %d created %v done %v\n", i, w.key, w.end, w.next, w.created, w.done)
		w.mu.Unlock()
	}
	r.etcd.mu.Unlock()
	return b.String()
}

// delivered reports whether every watcher not cancelled has its created
// response (every watch gets one first; until it comes, a watcher from
// now must receive nothing yet) and at least as many events as it must
// receive.
func (r *hubRig) delivered() bool {
	for _, m := range r.models {
		if m.canceled {
			continue
		}
		if len(m.rec.responses(m.w.id)) == 0 || len(r.got(m)) < len(r.want(m)) {
			return false
		}
	}
	return true
}

// check asserts the delivery invariant for every watcher: exactly its
// events in order (a prefix of them once cancelled).
func (r *hubRig) check() {
	for _, m := range r.models {
		want, got := r.want(m), r.got(m)
		if m.canceled {
			if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
				r.t.Fatalf("cancelled watch %d (%q..%q from %d): got %v, want a prefix of %v", m.w.id, m.key, m.end, m.start, got, want)
			}
			continue
		}
		if !slices.Equal(got, want) {
			r.t.Fatalf("watch %d (%q..%q from %d, created at %d, noPut %v, noDel %v): got %v, want %v",
				m.w.id, m.key, m.end, m.start, m.createdRev, m.noPut, m.noDel, got, want)
		}
	}
}

// checkGroups asserts the hub's structure: the groups hold only open
// upstreams of their own range (one is closed and removed under the
// hub's lock at once), each listed once, and every receiver of one points
// back to it; an upstream out of its group (its last watcher left, or
// merged into another) is closed, without receivers, its watch stopped.
func (r *hubRig) checkGroups() {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	seen := map[*upstream]bool{}
	for k, ups := range r.h.groups {
		if len(ups) == 0 {
			r.t.Fatalf("range %q..%q: an empty group", k.key, k.end)
		}
		for _, u := range ups {
			u.mu.Lock()
			closed, key := u.closed, u.key
			var stray bool
			u.recv.each(func(e *recvEntry) { stray = stray || e.w.up != u || !u.recv.has(e.w) })
			u.mu.Unlock()
			if closed || key != k || seen[u] || stray {
				r.t.Fatalf("range %q..%q: upstream closed %v, of range %q..%q, listed twice %v, a receiver pointing elsewhere %v",
					k.key, k.end, closed, key.key, key.end, seen[u], stray)
			}
			seen[u] = true
		}
	}
	for u := range r.ups {
		if seen[u] {
			continue
		}
		u.mu.Lock()
		closed, n, stopped := u.closed, u.recv.n, u.ctx.Err() != nil
		u.mu.Unlock()
		if !closed || n > 0 || !stopped {
			r.t.Fatalf("an upstream of range %q..%q out of its group: closed %v, %d receivers, watch stopped %v", u.key.key, u.key.end, closed, n, stopped)
		}
	}
}

// waitMerged sends every open upstream watch progress notifications (as
// etcd does to synced watches), each time the hub answered or at the next
// beat, until no range of hubRanges has more than one upstream watch, or
// hubTimeout: it returns a range that still has more, and how many. (The
// hub merges upstreams after each response, in the goroutine that
// received it: not yet done when step returns.)
func (r *hubRig) waitMerged() ([2]string, int) {
	deadline := time.Now().Add(hubTimeout)
	beat := time.NewTicker(5 * time.Millisecond)
	defer beat.Stop()
	for {
		wake := r.changed.next()
		worst, most := [2]string{}, 0
		for _, rg := range hubRanges {
			if n := r.upstreams(rg[0], rg[1]); n > most {
				worst, most = rg, n
			}
		}
		if most <= 1 || time.Now().After(deadline) {
			return worst, most
		}
		for _, w := range r.etcd.open() {
			r.etcd.step(w, 1000)
		}
		select {
		case <-wake:
		case <-beat.C:
		}
	}
}

// upstreams counts the hub's upstream watches of a range.
func (r *hubRig) upstreams(key, end string) int {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	return len(r.h.groups[watchKey{key: key, end: end}])
}

// hubTimeout bounds a wait for the in-memory hub.
const hubTimeout = 10 * time.Second

var hubRanges = [][2]string{{"a", ""}, {"b", ""}, {"a", "\x00"}, {"a", "c"}}

// TestHubDeliversEveryEventOnceInOrderUnderAnyInterleaving is the hub's
// model-based property: for random interleavings of watch creations (from
// now, from the past, from the next revision, with filters), cancels,
// writes and upstream responses of any size, every client watcher gets
// exactly the events of its range from its start revision, in order, none
// lost or repeated; and once everything is delivered, identical watches
// share one upstream watch.
func TestHubDeliversEveryEventOnceInOrderUnderAnyInterleaving(t *testing.T) {
	for seed := range uint64(40) {
		ok := t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 23))
			r := newHubRig(t, 3)
			keys := []string{"a", "b", "c"}
			for range 3 {
				r.etcd.write(keys[rnd.IntN(3)], false)
			}
			for range 150 {
				if rnd.IntN(6) == 0 { // a client stops or resumes reading
					if rec := r.recs[rnd.IntN(len(r.recs))]; rnd.IntN(2) == 0 {
						rec.held.Hold()
					} else {
						rec.held.Release()
					}
				}
				switch op := rnd.IntN(10); {
				case op < 2:
					rg := hubRanges[rnd.IntN(len(hubRanges))]
					var start int64
					if rnd.IntN(2) == 0 {
						start = 1 + rnd.Int64N(r.etcd.head()+1)
					}
					r.watchBehind(rnd.IntN(len(r.streams)), rg[0], rg[1], start, rnd.IntN(5) == 0, rnd.IntN(5) == 0, rnd.Int64N(3))
				case op < 3 && len(r.models) > 0:
					if m := r.models[rnd.IntN(len(r.models))]; !m.canceled {
						r.cancel(m)
					}
				case op < 6:
					r.etcd.write(keys[rnd.IntN(3)], rnd.IntN(4) == 0)
				default:
					if ws := r.etcd.open(); len(ws) > 0 {
						r.etcd.step(ws[rnd.IntN(len(ws))], 1+rnd.IntN(3))
					}
				}
				r.checkGroups()
			}
			for _, rec := range r.recs {
				rec.held.Release()
			}
			r.settle()
			r.check()
			// Synced, the upstreams of one range merge into one.
			if rg, n := r.waitMerged(); n > 1 {
				t.Errorf("range %q..%q: %d upstream watches once all are synced, want 1", rg[0], rg[1], n)
			}
		})
		if !ok {
			break // one failing seed says it
		}
	}
}

// TestHubMergesOnlyIntoAnUpstreamNotAhead pins the merge condition: the
// receivers of an upstream move to another only when that one has
// delivered nothing past what they still need (its next revision is not
// above theirs). One revision early, the watcher from the past would lose
// the event at the revision between them.
func TestHubMergesOnlyIntoAnUpstreamNotAhead(t *testing.T) {
	r := newHubRig(t, 1)
	for range 3 {
		r.etcd.write("a", false)
	}
	now := r.watch(0, "a", "", 0, false, false) // from 4
	r.etcd.step(r.etcd.watchAt(t, 0), 1)        // created
	r.etcd.step(r.etcd.watchAt(t, 0), 1)        // progress: synced at 3
	past := r.watch(0, "a", "", 1, false, false)
	if n := r.upstreams("a", ""); n != 2 {
		t.Fatalf("%d upstream watches, want 2 (a watcher from the past gets its own)", n)
	}
	hist := r.etcd.watchAt(t, 1)
	r.etcd.step(hist, 1) // created
	r.etcd.step(hist, 2) // revisions 1 and 2: one behind the other upstream
	r.etcd.step(hist, 1) // revision 3 (its send waits for the last one's merge check)
	r.etcd.write("a", false)
	r.settle()
	r.check()
	if got := r.got(past); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("watcher from 1 got %v", got)
	}
	if got := r.got(now); !slices.Equal(got, []int64{4}) {
		t.Fatalf("watcher from now got %v", got)
	}
}

// TestHubDoesNotMergeIntoAnUpstreamStillCatchingUp: a watcher from now
// stays on its own upstream while another of its range still replays
// history (moved there, its next events would wait behind that replay).
func TestHubDoesNotMergeIntoAnUpstreamStillCatchingUp(t *testing.T) {
	r := newHubRig(t, 1)
	for range 5 {
		r.etcd.write("a", false)
	}
	r.watch(0, "a", "", 0, false, false)
	now := r.etcd.watchAt(t, 0)
	r.etcd.step(now, 1) // created
	r.etcd.step(now, 1) // progress: synced
	r.watch(0, "a", "", 1, false, false)
	hist := r.etcd.watchAt(t, 1)
	r.etcd.step(hist, 1) // created
	r.etcd.step(hist, 1) // revision 1 of 5
	r.etcd.step(now, 1)  // another progress on the synced one: its merge check
	r.etcd.step(hist, 1) // revision 2 (waits for the previous merge check)
	r.etcd.step(now, 1)
	if n := r.upstreams("a", ""); n != 2 {
		t.Fatalf("%d upstream watches while one replays history, want 2", n)
	}
	r.settle()
	r.check()
}

// TestHubWatchersFromNowShareOneUpstream: identical watches from now
// share one upstream watch, whenever they come.
func TestHubWatchersFromNowShareOneUpstream(t *testing.T) {
	r := newHubRig(t, 2)
	r.etcd.write("a", false)
	r.watch(0, "a", "", 0, false, false)
	r.etcd.step(r.etcd.watchAt(t, 0), 1) // created
	r.etcd.write("a", false)
	r.watch(1, "a", "", 0, false, false) // from 3: the upstream is at 2
	r.etcd.write("a", false)
	r.watch(0, "a", "", 0, false, false)
	if n := r.upstreams("a", ""); n != 1 {
		t.Fatalf("%d upstream watches for identical watches from now, want 1", n)
	}
	r.etcd.write("a", true)
	r.settle()
	r.check()
}

// TestHubCancelledWatcherGetsNothingMore: after a cancel, a watcher gets
// its canceled response and no event; the upstream it alone used ends.
func TestHubCancelledWatcherGetsNothingMore(t *testing.T) {
	r := newHubRig(t, 1)
	r.etcd.write("a", false)
	m := r.watch(0, "a", "", 1, false, false)
	w := r.etcd.watchAt(t, 0)
	r.etcd.step(w, 1)
	r.etcd.step(w, 1)
	r.cancel(m)
	r.etcd.write("a", false)
	r.settle()
	r.check()
	if n := r.upstreams("a", ""); n != 0 {
		t.Fatalf("%d upstream watches after its only watcher left, want 0", n)
	}
	deadline := time.Now().Add(testTimeout)
	for {
		wake := m.rec.changed.next()
		resps := m.rec.responses(m.w.id)
		if len(resps) > 0 && resps[len(resps)-1].Canceled {
			break
		}
		if !waitChange(wake, deadline) {
			t.Fatalf("no canceled response: %v", resps)
		}
	}
}

// responses waits until m has received n responses, stepping every open
// etcd watch meanwhile, and returns them.
func (r *hubRig) responses(m *modelWatcher, n int) []*pb.WatchResponse {
	return r.awaitResponses(m, n, true)
}

// received waits until m has received n responses, sending nothing on the
// etcd watches: a step's send returns once the hub took the response, not
// once it dispatched it, so a test that acts on the hub next waits here.
func (r *hubRig) received(m *modelWatcher, n int) []*pb.WatchResponse {
	return r.awaitResponses(m, n, false)
}

func (r *hubRig) awaitResponses(m *modelWatcher, n int, step bool) []*pb.WatchResponse {
	deadline := time.Now().Add(hubTimeout)
	for {
		wake := r.changed.next()
		if resps := m.rec.responses(m.w.id); len(resps) >= n {
			return resps
		}
		if step {
			for _, w := range r.etcd.open() {
				r.etcd.step(w, 1000)
			}
		}
		if !waitChange(wake, deadline) {
			r.t.Fatalf("watch %d: %d responses, want %d", m.w.id, len(m.rec.responses(m.w.id)), n)
		}
	}
}

// TestHubNeverMergesIntoAClosedUpstream: an upstream whose last watcher
// left is closed and its watch stopped; its goroutine may still run the
// merge check after a response that was in flight, and the receivers of
// another upstream must not move to it (they would get nothing more).
func TestHubNeverMergesIntoAClosedUpstream(t *testing.T) {
	r := newHubRig(t, 1)
	for range 3 {
		r.etcd.write("a", false)
	}
	x := r.watch(0, "a", "", 0, false, false) // from 4
	r.etcd.step(r.etcd.watchAt(t, 0), 1)      // created: caught up at 3
	r.etcd.write("b", false)                  // 4, out of range
	r.watch(0, "a", "", 3, false, false)      // its own upstream, behind the first
	r.watch(0, "a", "", 1, false, false)      // a third, further behind
	closed := x.w.up
	r.cancel(x)
	v := r.etcd.watchAt(t, 1)
	r.etcd.step(v, 1) // created
	r.etcd.step(v, 1) // revision 3
	r.etcd.step(v, 1) // progress at 4: caught up, next 5, past the closed one's 4
	r.etcd.step(v, 1) // progress again: the previous merge check is done
	r.h.maybeMerge(closed)
	r.checkGroups()
	r.etcd.write("a", false)
	r.settle()
	r.check()
}

// TestHubLaggingCreateRevision: a watcher from now whose create read a
// revision behind the upstream it joins (a serializable read on a member
// behind the watches' member) is created at the revision before the
// upstream's next one, and gets no event below its start.
func TestHubLaggingCreateRevision(t *testing.T) {
	r := newHubRig(t, 2)
	for range 3 {
		r.etcd.write("a", false)
	}
	r.watch(0, "a", "", 0, false, false) // from 4
	up := r.etcd.watchAt(t, 0)
	r.etcd.step(up, 1) // created at 3
	r.etcd.write("a", false)
	r.etcd.step(up, 1) // revision 4: the upstream's next is 5
	r.etcd.step(up, 1) // progress (the previous response is dispatched)
	late := r.watchBehind(1, "a", "", 0, false, false, 2)
	r.etcd.write("a", false)
	resps := r.responses(late, 2) // created, then the event at 5
	r.settle()
	r.check()
	if len(resps) == 0 || !resps[0].Created || resps[0].Header.GetRevision() != 4 {
		t.Fatalf("watcher from now, create read revision 2, upstream at 5: first response %v, want created at 4", resps)
	}
	if got := r.got(late); !slices.Equal(got, []int64{5}) {
		t.Fatalf("watcher from now created at 4 got %v, want [5]", got)
	}
	if n := r.upstreams("a", ""); n != 1 {
		t.Fatalf("%d upstream watches, want 1", n)
	}
}

// TestHubUpstreamClosedWhenItsLastWatcherLeaves: upstreams merged into
// one, whose watchers then all leave, end: closed, out of their group,
// their etcd watch cancelled (checkGroups).
func TestHubUpstreamClosedWhenItsLastWatcherLeaves(t *testing.T) {
	r := newHubRig(t, 2)
	r.etcd.write("a", false)
	now := r.watch(0, "a", "", 0, false, false)
	past := r.watch(1, "a", "", 1, false, false)
	r.settle() // synced: merged into one
	if n := r.upstreams("a", ""); n != 1 {
		t.Fatalf("%d upstream watches once synced, want 1", n)
	}
	merged := now.w.up
	r.cancel(past)
	r.checkGroups()
	r.cancel(now)
	r.checkGroups()
	merged.mu.Lock()
	closed := merged.closed
	merged.mu.Unlock()
	if !closed || r.upstreams("a", "") != 0 {
		t.Fatalf("last watcher left: upstream closed %v, %d in the group; want closed, none", closed, r.upstreams("a", ""))
	}
}

// TestHubWatcherFromTheUpstreamsNextRevisionSharesIt: a watcher whose
// start is exactly the next revision of an upstream of its range joins
// it (it has delivered nothing the watcher needs).
// TestHubWatcherFromThePastJoinsOnlyAnUpstreamNotPastItsStart: a watcher
// from revision k is created while the upstream it fits (next revision k)
// dispatches the event at k. Whichever comes first, the watcher gets that
// event: it joins the upstream only if it is still at k when joined (the
// choice and the join are one hold of its lock; a check released before
// the join let the dispatch slip between and the watcher miss k), and
// otherwise opens its own from k. The race is run many times (it is rare:
// the dispatch must take the lock between the two), and the mechanism is
// pinned on its own: the upstream chosen comes back locked.
func TestHubWatcherFromThePastJoinsOnlyAnUpstreamNotPastItsStart(t *testing.T) {
	r := newHubRig(t, 1)
	r.etcd.write("a", false)
	r.watch(0, "a", "", 0, false, false) // from 2
	up := r.etcd.watchAt(t, 0)
	r.etcd.step(up, 1) // created
	for range 200 {
		k := r.etcd.write("a", false)
		stepped := make(chan struct{})
		go func() {
			defer close(stepped)
			r.etcd.step(up, 1) // the event at k: the upstream moves past it
		}()
		r.watch(0, "a", "", k, false, false)
		<-stepped
	}
	r.settle()
	r.check()

	k := watchKey{key: "a"}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	for name, lock := range map[string]func() *upstream{
		"fitting":     func() *upstream { return r.h.lockFittingLocked(k, r.etcd.head()+1) },
		"least ahead": func() *upstream { return r.h.lockLeastAheadLocked(k) },
	} {
		u := lock()
		if u == nil {
			t.Fatalf("%s: no upstream", name)
		}
		if u.mu.TryLock() {
			t.Fatalf("%s: the upstream came back unlocked: a dispatch may move it past the watcher's start before it joins", name)
		}
		u.mu.Unlock()
	}
}

func TestHubWatcherFromTheUpstreamsNextRevisionSharesIt(t *testing.T) {
	r := newHubRig(t, 1)
	r.etcd.write("a", false)
	r.watch(0, "a", "", 0, false, false) // from 2
	r.watch(0, "a", "", 2, false, false)
	if n := r.upstreams("a", ""); n != 1 {
		t.Fatalf("watcher from 2 beside an upstream at 2: %d upstream watches, want 1", n)
	}
	r.etcd.write("a", false)
	r.settle()
	r.check()
}

// progressAt waits for stream si's one progress notification (watch ID
// -1) and fails unless it is at revision rev.
func (r *hubRig) progressAt(si int, rev int64) {
	deadline := time.Now().Add(hubTimeout)
	for {
		wake := r.changed.next()
		if resps := r.recs[si].responses(clientv3.InvalidWatchID); len(resps) > 0 {
			if got := resps[0].Header.GetRevision(); len(resps) != 1 || got != rev {
				r.t.Fatalf("progress: %v, want one at revision %d", resps, rev)
			}
			return
		}
		if !waitChange(wake, deadline) {
			r.t.Fatalf("no progress notification within %v", hubTimeout)
		}
	}
}

// puts is an upstream response's events: puts of key a at revisions from
// to to, as memEtcd sends them.
func puts(from, to int64) []*clientv3.Event {
	var evs []*clientv3.Event
	for rev := from; rev <= to; rev++ {
		evs = append(evs, &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte("a"), Value: []byte(fmt.Sprint(rev)), ModRevision: rev}})
	}
	return evs
}

// TestHubProgressAtTheRevisionEveryWatcherHas: a client's progress
// request is answered once every upstream of its stream reported
// progress, at the highest revision every watcher of the stream has
// fully received (the lowest of theirs).
func TestHubProgressAtTheRevisionEveryWatcherHas(t *testing.T) {
	r := newHubRig(t, 1)
	r.etcd.write("a", false)
	r.watch(0, "a", "", 0, false, false) // created at 1
	r.watch(0, "b", "", 0, false, false)
	ua, ub := r.etcd.watchAt(t, 0), r.etcd.watchAt(t, 1)
	r.etcd.step(ua, 1) // created
	r.etcd.step(ub, 1)
	r.streams[0].requestProgress()
	r.etcd.write("c", false) // 2, in neither range
	r.etcd.step(ua, 1)       // progress at 2
	r.etcd.write("c", false) // 3
	r.etcd.step(ub, 1)       // progress at 3: the request is complete
	r.progressAt(0, 2)       // the watcher of a has all up to 2, of b up to 3
}

// bareStream is a client stream of r's hub without a sender: what it
// queues stays in its queue for the test to look at.
func (r *hubRig) bareStream() *cstream {
	ctx, cancel := context.WithCancelCause(context.Background())
	r.t.Cleanup(func() { cancel(nil) })
	rec := &recStream{ctx: ctx, changed: newChanges(), got: map[int64][]*pb.WatchResponse{}}
	s := newCStream(ctx, ctx, cancel, r.h, rec)
	r.h.addStream(s) // as serve does
	return s
}

// batchAt is an upstream response of one put of key a at rev, with a
// value of size bytes.
func batchAt(rev int64, size int) *evBatch {
	ev := &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte("a"), Value: make([]byte, size), ModRevision: rev}}
	return newBatch(&pb.ResponseHeader{Revision: rev}, []*mvccpb.Event{ev})
}

// sendQueued takes what waits for bare stream s and sends it, as its
// sender would (none runs on a bare stream).
func sendQueued(t *testing.T, s *cstream) *sender {
	t.Helper()
	var sn sender
	if err := s.flush(&sn); err != nil {
		t.Fatal(err)
	}
	return &sn
}

// TestStreamMergesAWatchersEventsUntilAControlResponse: events waiting
// for the same list of watchers (one version of an upstream's list)
// merge into one response per watcher while they fit the bound, also
// across events queued between them for other watchers; a control
// response for any watcher (a progress notification) ends the merge, so
// that nothing queued after it is sent before it; a batch past the bound
// starts a response of its own.
func TestStreamMergesAWatchersEventsUntilAControlResponse(t *testing.T) {
	r := newHubRig(t, 0)
	s := r.bareStream()
	fan := func(ids ...int64) []fanItem {
		var f []fanItem
		for _, id := range ids {
			f = append(f, fanItem{id: id, from: 1})
		}
		return f
	}
	s.enqueueEvents(batchAt(1, 1), fan(1, 2), 10)
	s.enqueueEvents(batchAt(2, 1), fan(1, 2), 10)
	s.enqueue(&pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 2}, WatchId: 1})
	s.enqueueEvents(batchAt(3, 1), fan(1, 2), 10)
	s.enqueueEvents(batchAt(3, 1), fan(3), 20) // another upstream's watcher
	s.enqueueEvents(batchAt(4, 1), fan(1, 2), 10)
	s.enqueueEvents(batchAt(5, maxMergeBytes), fan(1, 2), 10)
	sn := sendQueued(t, s)
	shape := func(id int64) []string {
		var got []string
		for _, resp := range s.ss.(*recStream).responses(id) {
			if len(resp.Events) == 0 {
				got = append(got, "progress")
				continue
			}
			got = append(got, fmt.Sprintf("%d events", len(resp.Events)))
		}
		return got
	}
	if got, want := shape(1), []string{"2 events", "progress", "2 events", "1 events"}; !slices.Equal(got, want) {
		t.Errorf("watcher 1 got %v, want %v", got, want)
	}
	if got, want := shape(2), []string{"2 events", "2 events", "1 events"}; !slices.Equal(got, want) {
		t.Errorf("watcher 2 got %v, want %v", got, want)
	}
	if got, want := shape(3), []string{"1 events"}; !slices.Equal(got, want) {
		t.Errorf("watcher 3 got %v, want %v", got, want)
	}
	if sn.events != 11 {
		t.Errorf("sent %d events, want 11", sn.events)
	}
}

// TestStreamBehindOnlyPastTheBound: a stream with as many responses
// waiting as its bound still takes the next; past it, the stream ends.
func TestStreamBehindOnlyPastTheBound(t *testing.T) {
	r := newHubRig(t, 0)
	r.h.p.watchQueue = 2
	s := r.bareStream()
	for range 3 {
		s.enqueue(&pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: 1})
	}
	s.mu.Lock()
	n, over := len(s.queue), s.overflow
	s.mu.Unlock()
	if n != 3 || over {
		t.Fatalf("bound 2, three responses: %d queued, overflow %v; want 3, none", n, over)
	}
	s.enqueue(&pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: 1})
	s.mu.Lock()
	over = s.overflow
	s.mu.Unlock()
	if !over || context.Cause(s.ctx) == nil {
		t.Fatal("bound 2, three waiting and one more: the stream was not ended")
	}
}

// TestAdmitRefusesAnEmptyRange: a range end at or below the key is
// refused, as etcd refuses it; above it, admitted.
func TestAdmitRefusesAnEmptyRange(t *testing.T) {
	s := newHubRig(t, 0).bareStream()
	for _, c := range []struct {
		key, end string
		refused  bool
	}{{"b", "a", true}, {"b", "b", true}, {"b", "c", false}, {"b", "", false}, {"b", "\x00", false}} {
		_, reason := s.admit(&pb.WatchCreateRequest{Key: []byte(c.key), RangeEnd: []byte(c.end), WatchId: clientv3.AutoWatchID})
		if (reason != "") != c.refused {
			t.Errorf("range %q..%q: reason %q, want refused %v", c.key, c.end, reason, c.refused)
		}
	}
}

// TestHubStreamIsAsFreshAsItsFreshestWatch: the silence check of a gRPC
// stream hears it when any of its watches heard etcd last (one quiet
// watch beside busy ones is no silent stream), and replaces the watches
// that are ahead from the highest revision etcd reported on any of them
// (the freshest, least likely compacted).
func TestHubStreamIsAsFreshAsItsFreshestWatch(t *testing.T) {
	r := newHubRig(t, 1)
	for i, key := range []string{"a", "b", "c"} {
		r.etcd.write(key, false)
		r.watch(0, key, "", 0, false, false)
		r.etcd.step(r.etcd.watchAt(t, i), 1) // created at i+1
		r.knownAt(key, int64(i+1))           // dispatched: heard is the test's to set
	}
	r.h.mu.Lock()
	for i, key := range []string{"a", "b", "c"} {
		r.h.groups[watchKey{key: key}][0].heard.Store(int64([]int{1, 3, 2}[i]) * int64(time.Second))
	}
	r.h.mu.Unlock()
	for range 10 { // the groups are a map: any order
		r.h.mu.Lock()
		streams := r.h.streamsLocked()
		r.h.mu.Unlock()
		if q := streams[watchKey{}]; len(streams) != 1 || q == nil || q.known != 3 || !q.heard.Equal(time.Unix(3, 0)) {
			t.Fatalf("streams %v, want one, known 3, heard at 3 s", streams)
		}
	}
}

// knownAt waits until an upstream of key has dispatched etcd's report of
// rev (its position's Known). Its goroutine stamps a response heard
// before it dispatches it, so nothing of that response changes the
// upstream after this returns; a step's send returns sooner, once the
// goroutine took the response.
func (r *hubRig) knownAt(key string, rev int64) {
	deadline := time.Now().Add(hubTimeout)
	beat := time.NewTicker(time.Millisecond)
	defer beat.Stop()
	for {
		var known int64
		r.h.mu.Lock()
		for _, u := range r.h.groups[watchKey{key: key}] {
			u.mu.Lock()
			known = max(known, u.pos.Known)
			u.mu.Unlock()
		}
		r.h.mu.Unlock()
		if known >= rev {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the upstream of %q knows revision %d after %v, want %d", key, known, hubTimeout, rev)
		}
		<-beat.C
	}
}

// TestHubReopenedWatchRepeatsNothing: an upstream watch opened again
// below the upstream's next revision (from the last revision etcd
// reported) repeats events its receivers had; they are dropped before
// the batch is shared (etcdwatch.Position.Fresh), not queued again.
func TestHubReopenedWatchRepeatsNothing(t *testing.T) {
	r := newHubRig(t, 0)
	s := r.bareStream()
	for range 3 {
		r.etcd.write("a", false)
	}
	w := &cwatcher{id: 1, s: s, key: watchKey{key: "a"}}
	if !r.h.attach(w, 1, &pb.ResponseHeader{Revision: 3}) {
		t.Fatal("attach refused")
	}
	first := r.etcd.watchAt(t, 0)
	r.etcd.step(first, 1)  // created
	r.etcd.step(first, 10) // 1..3
	r.etcd.step(first, 1)  // progress: the events are dispatched
	u := w.up
	r.h.mu.Lock()
	u.mu.Lock()
	u.reopenLocked(r.h.w, 2) // as the silence check does, from Known
	u.mu.Unlock()
	r.h.mu.Unlock()
	r.etcd.write("a", false)
	second := r.etcd.watchAt(t, 1)
	r.etcd.step(second, 1)  // created
	r.etcd.step(second, 10) // 2..4: 2 and 3 repeated
	r.etcd.step(second, 1)  // progress: the events are dispatched
	s.mu.Lock()
	defer s.mu.Unlock()
	var revs [][]int64
	for _, it := range s.queue {
		if it.b == nil {
			continue
		}
		var batch []int64
		for _, ev := range it.b.events {
			batch = append(batch, ev.Kv.ModRevision)
		}
		revs = append(revs, batch)
	}
	if fmt.Sprint(revs) != "[[1 2 3] [4]]" {
		t.Fatalf("batches queued %v, want [[1 2 3] [4]]", revs)
	}
}

// TestHubUpstreamCatchingUpAsksForProgress: an upstream that replays
// history asks etcd for progress once created, so that it learns it has
// caught up (and may merge) without waiting for etcd's periodic
// notification.
func TestHubUpstreamCatchingUpAsksForProgress(t *testing.T) {
	r := newHubRig(t, 1)
	r.etcd.write("a", false)
	r.watch(0, "a", "", 1, false, false)
	before := r.etcd.asked.Load()
	r.etcd.step(r.etcd.watchAt(t, 0), 1) // created
	deadline := time.Now().Add(hubTimeout)
	for {
		wake := r.changed.next()
		if r.etcd.asked.Load() > before {
			return
		}
		if !waitChange(wake, deadline) {
			t.Fatal("an upstream from the past, created, asked for no progress")
		}
	}
}

// TestHubMovedWatchIsHeardFromTheMove: an upstream moved to another
// member is silent only if that member says nothing from the move on: its
// silence is measured from then, not from the last response of the
// member it left.
func TestHubMovedWatchIsHeardFromTheMove(t *testing.T) {
	r := newHubRig(t, 1)
	m := r.watch(0, "a", "", 0, false, false)
	u := m.w.up
	u.heard.Store(0)
	start := time.Now()
	r.h.mu.Lock()
	u.restart(r.etcd)
	r.h.mu.Unlock()
	if heard := time.Unix(0, u.heard.Load()); heard.Before(start) {
		t.Fatalf("heard at %v, want at the move (%v) or later", heard, start)
	}
}

// TestHubResponseOfAReplacedWatchIsIgnored: once an upstream is fed by
// a new watch (moved to another member, or opened again), a response the
// watch it replaced still had in flight (here: canceled, as a member
// that is being left may say) is not handed to the receivers: the client
// watchers stay open and get every event once.
func TestHubResponseOfAReplacedWatchIsIgnored(t *testing.T) {
	r := newHubRig(t, 1)
	r.etcd.write("a", false)
	m := r.watch(0, "a", "", 1, false, false)
	old := r.etcd.watchAt(t, 0)
	r.etcd.step(old, 1) // created
	r.etcd.step(old, 1) // revision 1
	old.mu.Lock()       // the old watch's channel stays open until the send below
	r.h.mu.Lock()
	m.w.up.restart(r.etcd)
	r.h.mu.Unlock()
	old.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 1}, Canceled: true, CancelReason: "the member is leaving"}
	old.mu.Unlock()
	r.etcd.write("a", false)
	r.settle()
	r.check()
	for _, resp := range m.rec.responses(m.w.id) {
		if resp.Canceled {
			t.Fatalf("the client watcher was cancelled by the replaced watch's response: %v", resp)
		}
	}
}

// TestHubNoWatcherAttachedAfterItsStreamEnded: a client stream that ends
// while a watcher's create is under way (its Range in flight) keeps no
// watcher on an upstream: the stream's end (detachAll) found nothing to
// detach yet, so attach refuses the watcher, which is counted out and
// opens no upstream watch. Otherwise the upstream would feed a stream
// nobody reads, for good.
func TestHubNoWatcherAttachedAfterItsStreamEnded(t *testing.T) {
	r := newHubRig(t, 1)
	r.etcd.write("a", false)
	s := r.streams[0]
	s.detachAll() // the stream ends while create's Range is in flight
	w := &cwatcher{id: 7, s: s, key: watchKey{key: "a"}}
	s.add(w, 0, &pb.ResponseHeader{Revision: 1}) // the Range answers
	r.h.mu.Lock()
	up := w.up
	r.h.mu.Unlock()
	s.mu.Lock()
	kept := s.watchers[w.id] != nil
	s.mu.Unlock()
	if up != nil || r.upstreams("a", "") != 0 || kept || r.h.watchers.Load() != 0 {
		t.Fatalf("a watcher created on an ended stream: attached %v, %d upstream watches, kept by the stream %v, %d watchers counted; want none",
			up != nil, r.upstreams("a", ""), kept, r.h.watchers.Load())
	}
}

// TestHubMergedUpstreamIsClosedAtOnce: when two upstreams merge, the one
// whose receivers moved is closed at once (not only when its watch's
// channel ends), so that a response still in flight on its watch sends
// nothing and opens nothing through it: here a compaction below its next
// revision, which would open an open upstream's watch again
// (reopenCompacted) — on one that was merged, an etcd watch feeding no
// one, for good.
func TestHubMergedUpstreamIsClosedAtOnce(t *testing.T) {
	r := newHubRig(t, 1)
	for range 3 {
		r.etcd.write("a", false)
	}
	r.watch(0, "a", "", 0, false, false) // from 4: caught up at once
	r.etcd.watchAt(t, 0)                 // opened: the next is the other's
	past := r.watch(0, "a", "", 1, false, false)
	absorbed := past.w.up
	hist := r.etcd.watchAt(t, 1)
	r.etcd.step(hist, 1) // created
	hist.mu.Lock()       // its channel stays open while the test sends on it
	// Revisions 1..3: caught up at the other upstream's next revision, so
	// the merge after this response moves its receiver there.
	hist.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 3}, Events: puts(1, 3)}
	// In flight: a compaction below its next revision (the send returns once
	// the previous response and its merge are done).
	hist.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 3}, CompactRevision: 2, Canceled: true}
	// The compaction is dispatched once this is received.
	hist.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 3}}
	hist.mu.Unlock()
	r.h.mu.Lock()
	moved := past.w.up != absorbed
	r.h.mu.Unlock()
	absorbed.mu.Lock()
	closed := absorbed.closed
	absorbed.mu.Unlock()
	r.etcd.mu.Lock()
	opened := len(r.etcd.watches)
	r.etcd.mu.Unlock()
	if !moved || !closed || opened != 2 {
		t.Fatalf("merged: receiver moved %v, the upstream it left closed %v, %d etcd watches opened; want moved, closed, 2", moved, closed, opened)
	}
	r.checkGroups()
	r.etcd.write("a", false)
	r.settle()
	r.check()
}

// TestHubEndedUpstreamIsClosedAtOnce: an upstream ended (here: every
// watch cancelled, no member left to move to) is closed at once, so that
// a response still in flight on its watch — a compaction below its next
// revision, which would open an open upstream's watch again — opens no
// etcd watch that feeds no one.
func TestHubEndedUpstreamIsClosedAtOnce(t *testing.T) {
	r := newHubRig(t, 1)
	for range 3 {
		r.etcd.write("a", false)
	}
	m := r.watch(0, "a", "", 1, false, false)
	u := m.w.up
	mw := r.etcd.watchAt(t, 0)
	r.etcd.step(mw, 1)  // created
	r.etcd.step(mw, 10) // revisions 1..3: next 4
	r.received(m, 2)    // created, events: dispatched before the end
	mw.mu.Lock()        // its channel stays open while the test sends on it
	r.h.endAll("proxy: no etcd member is available")
	mw.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 3}, CompactRevision: 2, Canceled: true}
	mw.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 3}} // the compaction was dispatched
	mw.mu.Unlock()
	u.mu.Lock()
	closed := u.closed
	u.mu.Unlock()
	r.etcd.mu.Lock()
	opened := len(r.etcd.watches)
	r.etcd.mu.Unlock()
	if !closed || opened != 1 {
		t.Fatalf("ended: upstream closed %v, %d etcd watches opened; want closed, 1", closed, opened)
	}
	r.checkGroups()
	if resps := r.responses(m, 3); !resps[len(resps)-1].Canceled { // created, events, canceled
		t.Fatalf("the watcher of the ended upstream: %v, want a canceled response last", resps)
	}
}

// TestHubMergesIntoTheUpstreamBehindWhenItCatchesUp: the merge check
// after an upstream's response tries both directions: here the one that
// responded has caught up behind the other, so the other's receivers
// move to it at once, without waiting for the other (which may stay
// quiet) to respond.
func TestHubMergesIntoTheUpstreamBehindWhenItCatchesUp(t *testing.T) {
	r := newHubRig(t, 1)
	for range 3 {
		r.etcd.write("a", false)
	}
	r.watch(0, "a", "", 0, false, false) // from 4
	ahead := r.etcd.watchAt(t, 0)
	r.etcd.step(ahead, 1) // created at 3
	r.watch(0, "a", "", 1, false, false)
	behind := r.etcd.watchAt(t, 1)
	r.etcd.write("a", false)
	r.etcd.step(ahead, 1)  // revision 4: next 5
	r.etcd.step(ahead, 1)  // progress: revision 4 dispatched
	r.etcd.step(behind, 1) // created
	r.etcd.step(behind, 3) // revisions 1..3 at etcd's 4: next 4, not caught up
	if n := r.upstreams("a", ""); n != 2 {
		t.Fatalf("%d upstream watches before the one behind caught up, want 2", n)
	}
	behind.mu.Lock() // the test sends on its channel
	// Progress at 3: caught up, next 4, behind the other's 5.
	behind.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 3}}
	behind.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 3}} // the first and its merge check are done
	behind.mu.Unlock()
	if n := r.upstreams("a", ""); n != 1 {
		t.Fatalf("%d upstream watches once the one behind caught up, want 1 (the other's receivers moved to it)", n)
	}
	r.settle()
	r.check()
}

// TestHubProgressRequestSurvivesAMerge: a client's progress request
// waits for every upstream of its stream; when one of them merges into
// another, the wait moves to the one that absorbed it, so the request is
// answered once that one reports progress (the merged one never will).
func TestHubProgressRequestSurvivesAMerge(t *testing.T) {
	r := newHubRig(t, 1)
	for range 3 {
		r.etcd.write("a", false)
	}
	r.watch(0, "a", "", 0, false, false) // from 4
	now := r.etcd.watchAt(t, 0)
	r.etcd.step(now, 1) // created at 3
	r.watch(0, "a", "", 1, false, false)
	past := r.etcd.watchAt(t, 1)
	r.etcd.step(past, 1) // created
	r.streams[0].requestProgress()
	r.etcd.step(past, 10) // revisions 1..3: caught up, merged into the other
	r.etcd.step(past, 1)  // returns once that merge is done (sent, or its watch stopped)
	r.etcd.step(now, 1)   // progress at 3
	r.progressAt(0, 3)
}

// TestStreamEndedUpstreamCancelsOnlyItsOwnWatcher: when an upstream
// ends, each of its watchers that is still its stream's is dropped and
// cancelled; one the client already cancelled (it got its canceled
// response then) gets no second one, and a new watcher the client
// created with the same ID stays, uncancelled.
func TestStreamEndedUpstreamCancelsOnlyItsOwnWatcher(t *testing.T) {
	r := newHubRig(t, 0)
	u := &upstream{}
	for _, reused := range []bool{false, true} {
		s := r.bareStream()
		old := &cwatcher{id: 5, s: s}
		mine := old
		if reused {
			mine = &cwatcher{id: 5, s: s} // the client re-created ID 5
		}
		s.mu.Lock()
		s.watchers[5] = mine
		s.mu.Unlock()
		s.upstreamEnded(old, u, &pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: 5, Canceled: true})
		s.mu.Lock()
		kept, queued := s.watchers[5], len(s.queue)
		s.mu.Unlock()
		if reused && (kept != mine || queued != 0) {
			t.Fatalf("ID 5 re-created: the new watcher kept %v, %d responses queued; want kept, none", kept == mine, queued)
		}
		if !reused && (kept != nil || queued != 1) {
			t.Fatalf("the stream's own watcher: still listed %v, %d responses queued; want dropped, one (canceled)", kept != nil, queued)
		}
	}
}

// TestHubProgressRequestDoesNotWaitForAnEndedUpstream: a client's
// progress request waiting on several upstreams waits no more on one
// that ends (it will never report progress): the others' progress
// answers it.
func TestHubProgressRequestDoesNotWaitForAnEndedUpstream(t *testing.T) {
	r := newHubRig(t, 1)
	r.etcd.write("a", false)
	r.watch(0, "a", "", 0, false, false)
	ua := r.etcd.watchAt(t, 0)
	r.etcd.step(ua, 1) // created at 1
	mb := r.watch(0, "b", "", 0, false, false)
	r.etcd.step(r.etcd.watchAt(t, 1), 1)
	r.streams[0].requestProgress()
	r.h.mu.Lock()
	ub := mb.w.up
	r.h.mu.Unlock()
	ub.end(nil, 0, "proxy: the watch of b ended")
	r.etcd.step(ua, 1) // progress at 1: the request is complete
	r.progressAt(0, 1)
}

// TestHubLaggingWatcherFromNowJoinsTheUpstreamLeastAhead: a watcher from
// now whose create read a revision every upstream of its range has
// passed joins the one whose next revision is lowest: its created
// revision is then the closest to the one its create read (any of them
// would keep etcd's contract; the others start it further on).
func TestHubLaggingWatcherFromNowJoinsTheUpstreamLeastAhead(t *testing.T) {
	r := newHubRig(t, 1)
	for range 3 {
		r.etcd.write("a", false)
	}
	r.watch(0, "a", "", 0, false, false) // from 4
	aw := r.etcd.watchAt(t, 0)
	r.etcd.step(aw, 1) // created at 3
	r.etcd.write("a", false)
	r.etcd.write("a", false)
	r.etcd.step(aw, 10) // revisions 4, 5: next 6
	r.etcd.step(aw, 1)  // progress: dispatched
	r.watch(0, "a", "", 1, false, false)
	pw := r.etcd.watchAt(t, 1)
	r.etcd.step(pw, 1)                                                                           // created
	pw.mu.Lock()                                                                                 // the test sends on its channel
	pw.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 5}, Events: puts(1, 3)} // next 4, still replaying
	pw.ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 5}, Created: true}      // the events are dispatched
	pw.mu.Unlock()
	late := r.watchBehind(0, "a", "", 0, false, false, 3) // create read revision 2
	if resps := r.responses(late, 1); resps[0].Header.GetRevision() != 3 {
		t.Fatalf("watcher from now, create at 2, upstreams at 4 and 6: created at %d, want 3", resps[0].Header.GetRevision())
	}
	r.settle()
	r.check()
}

// TestHubWatcherFromThePastCreatedAtTheCurrentRevision: a watcher from a
// start revision is created, as etcd creates it, with the current
// revision its create read in the header (not the revision before its
// start), both on an upstream of its own and on one it joins.
func TestHubWatcherFromThePastCreatedAtTheCurrentRevision(t *testing.T) {
	r := newHubRig(t, 1)
	for range 3 {
		r.etcd.write("a", false)
	}
	own := r.watch(0, "a", "", 1, false, false)
	joined := r.watch(0, "a", "", 1, false, false)
	if n := r.upstreams("a", ""); n != 1 {
		t.Fatalf("%d upstream watches, want 1", n)
	}
	for _, m := range []*modelWatcher{own, joined} {
		if resps := r.responses(m, 1); !resps[0].Created || resps[0].Header.GetRevision() != 3 {
			t.Fatalf("watcher from 1 at revision 3: first response %v, want created at 3", resps[0])
		}
	}
	r.settle()
	r.check()
}
