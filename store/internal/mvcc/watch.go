package mvcc

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/beaconplane/beacon/store"
)

// MaxBatch bounds the events of one watch response; a revision is never
// split, so a response may exceed it by one revision's events.
const MaxBatch = 1000

// CheckWatch checks the arguments of store.Watcher.Watch.
func CheckWatch(prefix string, fromRevision int64) error {
	if err := store.ValidatePrefix(prefix); err != nil {
		return err
	}
	if fromRevision < 0 {
		return fmt.Errorf("store: watch from negative revision %d", fromRevision)
	}
	return nil
}

// Failed returns a watch channel that delivers err and closes: how a watch
// reports bad arguments or a closed store.
func Failed(err error) store.WatchChan {
	ch := make(chan store.WatchResponse, 1)
	ch <- store.WatchResponse{Err: err}
	close(ch)
	return ch
}

// Watch implements store.Watcher from the event log: fromRevision 0 means
// the revision after the current one. The watch's goroutine ends when ctx
// ends, on Close, or after it sends a *store.CompactedError because its
// next revision left the log.
func (s *Store) Watch(ctx context.Context, prefix string, fromRevision int64) store.WatchChan {
	if err := CheckWatch(prefix, fromRevision); err != nil {
		return Failed(err)
	}
	if err := s.lock(ctx); err != nil {
		return Failed(err)
	}
	next := fromRevision
	if next == 0 {
		next = s.rev + 1
	}
	epoch := s.epoch
	s.watchers.Add(1)
	s.mu.Unlock()
	ch := make(chan store.WatchResponse, 1)
	go s.watch(ctx, ch, prefix, next, epoch)
	return ch
}

// watch feeds one watcher from the event log, starting at revision next,
// until a Reset ends the epoch it started in.
func (s *Store) watch(ctx context.Context, ch chan<- store.WatchResponse, prefix string, next int64, epoch uint64) {
	defer s.watchers.Done()
	defer close(ch)
	for {
		resp, last, changed, ok := s.read(prefix, next, epoch)
		switch {
		case !ok:
			return // closed
		case resp.Err != nil:
			select {
			case ch <- resp:
			case <-ctx.Done():
			case <-s.done:
			}
			return
		case last == 0: // nothing new yet
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return
			case <-s.done:
				return
			}
		}
		next = last + 1
		if len(resp.Events) == 0 {
			continue // only other prefixes changed
		}
		select {
		case ch <- resp:
		case <-ctx.Done():
			return
		case <-s.done:
			return
		}
	}
}

// read takes what a watcher at revision next has to send: the Reset's
// error if the state was reset since the watch began (epoch), a
// *store.CompactedError if next left the log, or the events under prefix
// (see collectLocked) with the last revision examined; with nothing new,
// the channel that the next change closes. It reports false once closed.
func (s *Store) read(prefix string, next int64, epoch uint64) (resp store.WatchResponse, last int64, changed <-chan struct{}, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return resp, 0, nil, false
	}
	if epoch != s.epoch {
		resp.Err = s.resetErr
		return resp, 0, nil, true
	}
	if next < s.compact {
		resp.Err = &store.CompactedError{Requested: next, CompactRevision: s.compact}
		return resp, 0, nil, true
	}
	resp.Events, last = s.collectLocked(prefix, next)
	return resp, last, s.changed, true
}

// collectLocked returns copies of the events under prefix from revision
// next on, at most about MaxBatch of them without splitting a revision,
// and the last revision it examined (0 if the log holds nothing at or
// after next).
func (s *Store) collectLocked(prefix string, next int64) ([]store.Event, int64) {
	i := sort.Search(len(s.log), func(i int) bool { return s.log[i].KV.ModRevision >= next })
	var out []store.Event
	var last int64
	for ; i < len(s.log); i++ {
		ev := s.log[i]
		if rev := ev.KV.ModRevision; rev != last {
			if len(out) >= MaxBatch {
				break
			}
			last = rev
		}
		if strings.HasPrefix(ev.KV.Key, prefix) {
			ev.KV = cloneKV(&ev.KV)
			out = append(out, ev)
		}
	}
	return out, last
}
