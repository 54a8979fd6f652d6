package file

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/beaconplane/beacon/store"
)

// Watch implements store.Watcher. Watches read the in-memory history that
// this process keeps while following the log, so a slow watcher never
// blocks writers; one that falls behind the history window ends with a
// *store.CompactedError.
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
		return fail(fmt.Errorf("store: watch from negative revision %d", fromRevision))
	}
	if err := s.sync(ctx); err != nil {
		return fail(err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fail(store.ErrClosed)
	}
	next := fromRevision
	if next == 0 {
		next = s.rev + 1
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go s.watch(ctx, ch, prefix, next)
	return ch
}

func (s *Store) watch(ctx context.Context, ch chan<- store.WatchResponse, prefix string, next int64) {
	defer s.wg.Done()
	defer close(ch)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		if next < s.compact {
			err := &store.CompactedError{Requested: next, CompactRevision: s.compact}
			s.mu.Unlock()
			select {
			case ch <- store.WatchResponse{Err: err}:
			case <-ctx.Done():
			case <-s.done:
			}
			return
		}
		events, last := s.collectLocked(prefix, next)
		changed := s.changed
		s.mu.Unlock()
		if last == 0 {
			select {
			case <-changed:
			case <-ctx.Done():
				return
			case <-s.done:
				return
			}
			continue
		}
		next = last + 1
		if len(events) == 0 {
			continue
		}
		select {
		case ch <- store.WatchResponse{Events: events}:
		case <-ctx.Done():
			return
		case <-s.done:
			return
		}
	}
}

// collectLocked returns the events under prefix from revision next on, at
// most about maxBatch of them without splitting a revision, and the last
// revision it examined (0 if the history holds nothing at or after next).
func (s *Store) collectLocked(prefix string, next int64) ([]store.Event, int64) {
	i := sort.Search(len(s.events), func(i int) bool { return s.events[i].KV.ModRevision >= next })
	var out []store.Event
	var last int64
	for ; i < len(s.events); i++ {
		ev := s.events[i]
		if rev := ev.KV.ModRevision; rev != last {
			if len(out) >= maxBatch {
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
