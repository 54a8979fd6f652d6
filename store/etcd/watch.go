package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/beaconplane/beacon/internal/etcdwatch"
	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
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
//     than one that may have been compacted. Watch does not deliver
//     them; WatchProgress does (store.ProgressWatcher). A
//     quiet watch that starts ahead of etcd's revision (the revision after
//     a listing, on a key space nobody wrote to since) is opened again
//     from the last revision etcd reported, without losing or repeating
//     an event, and survives a compaction of other keys (internal/etcdwatch
//     says how).
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
	return s.startWatch(ctx, prefix, fromRevision, false)
}

// WatchProgress implements store.ProgressWatcher: Watch, with etcd's
// progress notifications (those the watch asks for when quiet, and etcd's
// periodic ones) delivered as responses whose Progress is the revision
// up to which every event was delivered.
func (s *Store) WatchProgress(ctx context.Context, prefix string, fromRevision int64) store.WatchChan {
	return s.startWatch(ctx, prefix, fromRevision, true)
}

// ProgressInterval implements store.ProgressWatcher: a quiet watch asks
// its member for progress after half of Config.WatchSilenceTimeout, then
// every quarter, so while the member answers a notification comes at
// least every three quarters of it; 0 when the silence check is off.
func (s *Store) ProgressInterval() time.Duration { return s.watchSilence * 3 / 4 }

func (s *Store) startWatch(ctx context.Context, prefix string, fromRevision int64, progress bool) store.WatchChan {
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
	go s.watch(ctx, ch, prefix, fromRevision, created, progress)
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
// fails. It closes created once etcd has created the watch. The watch
// itself (progress requests, the replacement of a quiet watch ahead of
// etcd, the compaction fall-back, the silence verdict) is etcdwatch's.
func (s *Store) watch(ctx context.Context, ch chan<- store.WatchResponse, prefix string, from int64, created chan<- struct{}, progress bool) {
	defer s.wg.Done()
	defer close(ch)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	stop := context.AfterFunc(s.closeCtx, cancel)
	defer stop()
	send := func(ctx context.Context, resp store.WatchResponse) error {
		select {
		case ch <- resp:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var onProgress func(ctx context.Context, rev int64) error
	if progress {
		onProgress = func(ctx context.Context, rev int64) error {
			return send(ctx, store.WatchResponse{Progress: rev})
		}
	}
	// The empty prefix is the whole key space: clientv3.WithPrefix turns
	// the empty key into the range ["\x00", end).
	err := etcdwatch.Run(wctx, etcdwatch.Config{
		Client:       s.cli,
		Key:          prefix,
		Options:      []clientv3.OpOption{clientv3.WithPrefix()},
		Silence:      s.watchSilence,
		BeforeSilent: s.beforeSilent,
		Created:      func() { close(created) },
		Deliver: func(ctx context.Context, _ int64, es []*clientv3.Event) error {
			evs := make([]store.Event, len(es))
			for i, e := range es {
				evs[i] = fromEvent(e)
			}
			return send(ctx, store.WatchResponse{Events: evs})
		},
		Progress: onProgress,
	}, from)
	if err == nil || wctx.Err() != nil {
		return // cancelled or closed: close without an error
	}
	var (
		ce *etcdwatch.CompactedError
		se *etcdwatch.SilentError
	)
	switch {
	case errors.As(err, &ce):
		err = &store.CompactedError{Requested: ce.Requested, CompactRevision: ce.CompactRevision}
	case errors.As(err, &se):
		err = fmt.Errorf("%w: %w: etcd watch %q: nothing from etcd (no event, no progress notification) for %v; watch again",
			store.ErrWatchSilent, store.ErrUnavailable, prefix, se.Quiet.Round(time.Millisecond))
	case errors.Is(err, etcdwatch.ErrClientClosed):
		// The Store is not closed, so its client was.
		err = fmt.Errorf("etcd watch %q: %w: the etcd client was closed", prefix, store.ErrClosed)
	default:
		err = s.wrap(ctx, wctx, fmt.Sprintf("watch %q", prefix), err)
	}
	select {
	case ch <- store.WatchResponse{Err: err}:
	case <-wctx.Done():
	}
}

// beforeSilent has the prober sweep the members before a silent watch
// ends, so that the next watch goes to a member that answers, and reports
// whether the watch should carry on instead (etcdwatch.Config.BeforeSilent):
// it should unless a member is left out. Ending a watch helps only when
// another member would serve the next one better: one that hangs or is
// cut off is left out by the sweep (probed silent, or without a leader,
// while another answers with one). When every member answers, the silence
// is etcd lagging behind its writes; when none does (the cluster down, or
// this process starved of CPU), the next watch would fare no better — and
// in both cases a re-list adds load to an etcd that already cannot keep
// up. A store with one endpoint has no prober: its silent watches end.
func (s *Store) beforeSilent(ctx context.Context) bool {
	if s.prober == nil {
		return false
	}
	t := time.NewTimer(2 * s.prober.timeout)
	defer t.Stop()
	select {
	case <-s.prober.suspect():
	case <-t.C:
		// A sweep still running leaves out a member that hangs when it
		// ends; the watch's next silence sees it.
	case <-ctx.Done():
		return false
	}
	return len(s.prober.excluded()) == 0
}

func fromEvent(e *clientv3.Event) store.Event {
	if e.Type == mvccpb.Event_DELETE {
		return store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: string(e.Kv.Key), ModRevision: e.Kv.ModRevision}}
	}
	kv := fromKV(e.Kv)
	kv.Value = nonNil(kv.Value)
	return store.Event{Type: store.EventPut, KV: kv}
}
