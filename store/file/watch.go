package file

import (
	"context"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/internal/mvcc"
)

// Watch implements store.Watcher. Watches read the in-memory history that
// this process keeps while following the log, so a slow watcher never
// blocks writers; one that falls behind the history window ends with a
// *store.CompactedError. The store first catches up with the log, so a
// watch from 0 starts after every write acknowledged before Watch.
func (s *Store) Watch(ctx context.Context, prefix string, fromRevision int64) store.WatchChan {
	if err := mvcc.CheckWatch(prefix, fromRevision); err != nil {
		return mvcc.Failed(err)
	}
	if err := s.core.Usable(ctx); err != nil {
		return mvcc.Failed(err)
	}
	// Under tmu, so that the store cannot be re-opened in between
	// (identity.go): the watch starts in the history it synced with.
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if err := s.syncLocked(); err != nil {
		return mvcc.Failed(err)
	}
	return s.core.Watch(ctx, prefix, fromRevision)
}
