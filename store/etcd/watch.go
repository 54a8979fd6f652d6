package etcd

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Watch implements store.Watcher over one etcd watch (clientv3 multiplexes
// the Store's watches over one gRPC stream).
//
//   - Each etcd watch response becomes one store.WatchResponse, so the
//     events of one revision (a transaction, a lease expiry) stay together.
//   - fromRevision 0 starts at the revision current when etcd creates the
//     watch; Watch waits for that (at most RequestTimeout, and not past
//     ctx or Close), so writes made after it returns are seen.
//   - If the connection drops, the etcd client reconnects and resumes the
//     watch from the revision after the last one delivered: no gap, no
//     repeat, and nothing is delivered during the outage. If that revision
//     was compacted meanwhile, the watch ends with a *store.CompactedError.
//   - The watch requires a leader (clientv3.WithRequireLeader): a member
//     cut off from its cluster's leader ends the watch with an error
//     matching store.ErrUnavailable instead of leaving it silently stale.
//   - The watch asks for progress notifications, which let a watch of a
//     quiet prefix resume from a recent revision after a reconnect rather
//     than one that may have been compacted. They are not delivered.
//     etcd answers progress requests only for watches that do not start
//     ahead of its revision, and the revision after a listing is ahead of
//     it until some write: such a watch, once quiet for half the silence
//     timeout, is opened again from the last revision etcd reported (the
//     events it then repeats are dropped), on a stream of its own; the
//     first watch runs on until etcd has synced the new one, and stays if
//     that revision was compacted meanwhile (other keys written, then
//     compacted: none of this watch's events are gone, and its start is
//     no longer ahead). It is not opened early from the start, because
//     etcd delivers the events of a watch that starts in the past only
//     from its next sync, up to 100 ms later.
//   - The watch notices its own silence (Config.WatchSilenceTimeout): each
//     watch has a gRPC stream of its own, and one that has heard nothing
//     for half the timeout asks its member for a progress notification. A
//     watch that still hears nothing when the timeout is up (its member
//     hangs, or is cut off, or the whole cluster is down) ends, within 1.25
//     times the timeout plus up to two ProbeTimeouts, with an error
//     matching store.ErrWatchSilent and store.ErrUnavailable, after the
//     members were probed, so that the next watch goes to a member that
//     answers.
//   - A consumer that falls behind never blocks writers or other watches:
//     the etcd client buffers the responses it has not taken, in memory
//     and without a bound, so drain the channel promptly.
func (s *Store) Watch(ctx context.Context, prefix string, fromRevision int64) store.WatchChan {
	ch := make(chan store.WatchResponse, 1)
	fail := func(err error) store.WatchChan {
		ch <- store.WatchResponse{Err: err}
		close(ch)
		return ch
	}
	if err := store.ValidatePrefix(prefix); err != nil {
		return fail(err)
	}
	if fromRevision < 0 {
		return fail(fmt.Errorf("etcd watch %q: negative start revision %d", prefix, fromRevision))
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return fail(fmt.Errorf("etcd watch %q: %w", prefix, store.ErrClosed))
	}
	s.wg.Add(1)
	s.mu.Unlock()
	created := make(chan struct{})
	go s.watch(ctx, ch, prefix, fromRevision, created)
	if fromRevision == 0 {
		t := time.NewTimer(s.requestTimeout)
		defer t.Stop()
		select {
		case <-created:
		case <-ctx.Done():
		case <-s.closeCtx.Done():
		case <-t.C:
		}
	}
	return ch
}

// watch runs one watch until ctx ends, the Store closes, or the watch
// fails. It closes created once etcd has created the watch.
func (s *Store) watch(ctx context.Context, ch chan<- store.WatchResponse, prefix string, from int64, created chan<- struct{}) {
	defer s.wg.Done()
	defer close(ch)
	// A stream of its own (clientv3 shares one gRPC stream among watches
	// with the same metadata): a progress request then tests this watch's
	// stream, and a new watch after a silent one gets a new stream, on a
	// member the balancer picks again.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	stream := func() context.Context {
		return metadata.AppendToOutgoingContext(wctx, watchIDKey, strconv.FormatUint(s.watchSeq.Add(1), 10))
	}
	sctx := stream() // the current etcd watch's stream
	stop := context.AfterFunc(s.closeCtx, cancel)
	defer stop()

	// The empty prefix is the whole key space: clientv3.WithPrefix turns
	// the empty key into the range ["\x00", end). clientv3's Watch blocks
	// until it has opened the gRPC stream, which never happens on a hung
	// member: it runs aside, so that the silence check covers it too.
	var (
		ech      clientv3.WatchChan // nil until Watch returned
		echc     chan clientv3.WatchChan
		unwatch  context.CancelFunc // ends the current etcd watch
		opens    sync.WaitGroup     // the goroutines calling Watch
		openedAt int64              // the revision the current etcd watch started from (0: now)
		known    int64              // the highest revision etcd reported on this watch
		reopened bool               // opened again from known already, or must not be
		// The watch from known that replaces a quiet watch started ahead
		// of etcd's revision (see below), on a stream of its own, until
		// etcd has synced it: the current watch runs on until then, so
		// that nothing it delivers meanwhile is lost, and stays if known
		// turns out compacted (etcd creates a watch from a compacted
		// revision, and says it is compacted only when it syncs it).
		tch      clientv3.WatchChan
		tchc     chan clientv3.WatchChan
		tunwatch context.CancelFunc
		tfrom    int64
		tsctx    context.Context
		tcreated bool
	)
	start := func(sctx context.Context, rev int64) (chan clientv3.WatchChan, context.CancelFunc) {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify(), clientv3.WithProgressNotify()}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		// A context of its own with the stream's metadata: cancelling it
		// ends only this etcd watch.
		octx, ocancel := context.WithCancel(sctx)
		c := make(chan clientv3.WatchChan, 1)
		opens.Go(func() { c <- s.cli.Watch(octx, prefix, opts...) })
		return c, ocancel
	}
	open := func(rev int64) {
		if unwatch != nil {
			unwatch()
		}
		ech, openedAt = nil, rev
		echc, unwatch = start(sctx, rev)
	}
	reopen := func(rev int64) {
		if tunwatch != nil {
			tunwatch()
		}
		tch, tfrom, tsctx, tcreated = nil, rev, stream(), false
		tchc, tunwatch = start(tsctx, rev)
	}
	dropTrial := func() {
		tunwatch()
		tch, tchc, tunwatch, tsctx, tcreated = nil, nil, nil, nil, false
	}
	open(from)
	defer func() {
		cancel()
		opens.Wait() // Watch returns once its context is done
	}()
	next := from // the first revision not yet delivered (0: not known yet)
	isCreated := false
	end := func(err error) {
		select {
		case ch <- store.WatchResponse{Err: err}:
		case <-wctx.Done():
		}
	}
	var check <-chan time.Time
	if s.watchSilence > 0 {
		t := time.NewTicker(s.watchSilence / 4)
		defer t.Stop()
		check = t.C
	}
	heard := time.Now() // when etcd last said something on this watch
	for {
		var (
			wr    clientv3.WatchResponse
			ok    bool
			trial bool // wr is the replacement watch's
		)
		select {
		case ech = <-echc:
			continue
		case tch = <-tchc:
			continue
		case wr, ok = <-ech:
			heard = time.Now()
		case wr, ok = <-tch:
			heard = time.Now()
			trial = true
		case <-check:
			if tcreated {
				// Until etcd has synced the replacement watch (every
				// 100 ms), which it answers only then.
				s.requestProgress(tsctx)
			}
			quiet := time.Since(heard)
			if quiet < s.watchSilence/2 {
				continue
			}
			if quiet < s.watchSilence {
				switch {
				case ech == nil, tchc != nil:
				case openedAt > known && known > 0 && !reopened:
					// etcd (3.6.8 and later) answers a progress request
					// only once its revision has reached the start of
					// every watch on the stream, and this one started
					// ahead of it (the revision after a listing, on a
					// key space nobody wrote to since): it would never
					// be answered, and a healthy member would look
					// hung. Watch again from the last revision etcd
					// reported (its events are below next: dropped);
					// its created response is the sign of life.
					reopened = true
					reopen(known)
				default:
					s.requestProgress(sctx)
				}
				continue
			}
			if s.prober != nil {
				// Let the probe leave the silent member out first, so
				// that the caller's next watch goes elsewhere — but never
				// wait past the stated bound (two probe timeouts: one
				// sweep may be running, the next is ours).
				t := time.NewTimer(2 * s.prober.timeout)
				select {
				case <-s.prober.suspect():
				case <-t.C:
				case <-wctx.Done():
					t.Stop()
					return
				}
				t.Stop()
			}
			end(fmt.Errorf("%w: %w: etcd watch %q: nothing from etcd (no event, no progress notification) for %v; watch again",
				store.ErrWatchSilent, store.ErrUnavailable, prefix, quiet.Round(time.Millisecond)))
			return
		case <-wctx.Done():
			return
		}
		switch {
		case wctx.Err() != nil:
			return // cancelled or closed: close without an error
		case trial && ok && wr.CompactRevision != 0:
			// The replacement's start is compacted: etcd's revision
			// moved on since it last reported one (writes to other
			// keys, then a compaction). The current watch missed
			// nothing: it stays. Its start is now within etcd's
			// revision (progress requests are answered), unless etcd is
			// still behind it (a watch from a later revision): then a
			// replacement from the revision etcd has now (this
			// response's, at or above the compaction).
			dropTrial()
			known = max(known, wr.Header.Revision)
			if openedAt > known {
				reopen(known)
			}
			continue
		case trial && ok && wr.Created && wr.Err() == nil:
			// Created; etcd syncs it within 100 ms, and then answers a
			// progress request or sends its events (or says known is
			// compacted).
			tcreated = true
			known = max(known, wr.Header.Revision)
			s.requestProgress(tsctx)
			continue
		case trial && ok && wr.Err() == nil:
			// Synced: the replacement takes over (its events below next
			// are dropped below).
			unwatch()
			ech, echc, unwatch, openedAt, sctx = tch, nil, tunwatch, tfrom, tsctx
			tch, tchc, tunwatch, tsctx, tcreated = nil, nil, nil, nil, false
			if wr.IsProgressNotify() {
				known = max(known, wr.Header.Revision)
				next = max(next, wr.Header.Revision+1)
				continue
			}
		case !ok:
			// Only a closed client ends a clientv3 watch without a
			// response; the Store is not closed, so its client was.
			end(fmt.Errorf("etcd watch %q: %w: the etcd client was closed", prefix, store.ErrClosed))
			return
		case wr.CompactRevision != 0 && openedAt > 0 && openedAt < next && wr.CompactRevision <= next:
			// Only revisions below next are compacted, which the watch
			// reopened earlier did not need: watch from next again.
			open(next)
			continue
		case wr.CompactRevision != 0:
			end(&store.CompactedError{Requested: next, CompactRevision: wr.CompactRevision})
			return
		case wr.Err() != nil:
			end(s.wrap(ctx, wctx, fmt.Sprintf("watch %q", prefix), wr.Err()))
			return
		case wr.Created:
			known = max(known, wr.Header.Revision)
			if next == 0 {
				next = wr.Header.Revision + 1
			}
			if !isCreated {
				isCreated = true
				close(created)
			}
			continue
		case wr.IsProgressNotify():
			known = max(known, wr.Header.Revision)
			next = max(next, wr.Header.Revision+1)
			continue
		}
		known = max(known, wr.Header.Revision)
		evs := make([]store.Event, 0, len(wr.Events))
		for _, e := range wr.Events {
			if e.Kv.ModRevision < next {
				continue // already delivered (defensive: clientv3 resumes after it)
			}
			evs = append(evs, fromEvent(e))
		}
		if len(evs) == 0 {
			continue
		}
		next = evs[len(evs)-1].KV.ModRevision + 1
		select {
		case ch <- store.WatchResponse{Events: evs}:
			// Time spent waiting for a slow consumer is not silence.
			heard = time.Now()
		case <-wctx.Done():
			return
		}
	}
}

// watchIDKey is the gRPC metadata key that gives each watch a stream of its
// own.
const watchIDKey = "beacon-watch"

// requestProgress asks the member behind wctx's stream for a progress
// notification (answered on that stream once its watches are synced).
func (s *Store) requestProgress(wctx context.Context) {
	ctx, cancel := context.WithTimeout(wctx, s.watchSilence/4)
	defer cancel()
	_ = s.cli.RequestProgress(ctx) // a failure shows as continued silence
}

func fromEvent(e *clientv3.Event) store.Event {
	if e.Type == mvccpb.Event_DELETE {
		return store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: string(e.Kv.Key), ModRevision: e.Kv.ModRevision}}
	}
	kv := fromKV(e.Kv)
	kv.Value = nonNil(kv.Value)
	return store.Event{Type: store.EventPut, KV: kv}
}
