package file

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// A store is the directory at its path, and which directory that is, is
// its lock file: the one file that is never removed or replaced while the
// store lives. An operator may move the directory away and put another
// (a backup) at the path under live processes; a process that kept its
// open files would then write into a log nobody reads and watch a history
// that no longer grows, silently. So each process compares the lock file
// at the path with the one it holds (device and inode): every write does,
// under the lock (so that no write lands in a directory that has been
// replaced), and the background loop does at every poll (so that a process
// that only reads or watches notices within a second). When they differ,
// or the lock file is gone, the process logs it, ends its watches with
// ErrReplaced (watchers re-list) and re-opens the store at the path; until
// a store is there again, reads and writes fail with ErrReplaced and the
// reason. It never creates a store at the path itself: the directory was
// moved away on purpose, and the operator (or a newly started process)
// decides what comes in its place. The leases of the old directory do not
// exist in the new one, so their holders' KeepAlive fails with
// store.ErrLeaseNotFound, and registrants register again, there.

// ErrReplaced reports that the store directory was moved away, removed or
// replaced by another under this process; its watches end with it, so
// that watchers re-list the store now at the path.
var ErrReplaced = errors.New("file: the store directory was moved away, removed or replaced under this process")

// checkPlace reports, with an error matching ErrReplaced, a lock file at
// the path that is not the one this process holds; other errors are
// failures to tell.
func (s *Store) checkPlace() error {
	p := s.path(lockName)
	held, err := s.lockf.Stat()
	if err != nil {
		return fmt.Errorf("file: cannot stat %s: %w", p, err)
	}
	now, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s is gone", ErrReplaced, p)
	case err != nil:
		return fmt.Errorf("file: cannot check the store directory %s: %w", s.dir, err)
	case !os.SameFile(held, now):
		return fmt.Errorf("%w: %s is another file than the one this process opened", ErrReplaced, p)
	}
	return nil
}

// markLost records that the directory at the path is no longer the one
// this process has open: it ends every watch with cause and forgets the
// old state. The caller holds the write slot and not the store's lock.
func (s *Store) markLost(cause error) {
	s.tmu.Lock()
	first := s.lost == nil
	s.lost = cause
	s.core.Reset(cause)
	s.tmu.Unlock()
	s.lmu.Lock()
	clear(s.leaseTTLs)
	clear(s.leaseDeadlines)
	s.lmu.Unlock()
	if first {
		s.logger.Warn("the store directory is no longer the one this process opened: its watches end, and it re-opens the store at the path as soon as there is one",
			"err", cause)
	}
}

// reopen opens the store now at the path in place of the lost one. The
// caller holds the write slot and not the store's lock.
func (s *Store) reopen(ctx context.Context) error {
	lost := s.lost
	if err := s.checkExists(); err != nil {
		return fmt.Errorf("%w; no store to re-open there yet: %w", lost, err)
	}
	f, err := os.OpenFile(s.path(lockName), os.O_RDWR|os.O_CREATE, filePerm)
	if err != nil {
		return fmt.Errorf("%w; cannot re-open the store: %w", lost, err)
	}
	if err := s.waitLock(ctx, f, f.Name()); err != nil {
		_ = f.Close()
		return err
	}
	defer func() { _ = unlockFile(f) }()
	s.tmu.Lock()
	defer s.tmu.Unlock()
	s.core.Reset(lost) // a failed attempt may have loaded part of the state
	_ = s.lockf.Close()
	s.lockf = f
	if err := s.recoverFiles(); err != nil {
		return fmt.Errorf("%w; cannot re-open the store: %w", lost, err)
	}
	if err := s.load(); err != nil {
		return fmt.Errorf("%w; cannot re-open the store: %w", lost, err)
	}
	s.lost = nil
	if s.notifier != nil {
		_ = s.notifier.Remove(s.path(walDir))
		if err := s.notifier.Add(s.path(walDir)); err != nil {
			s.logger.Warn("filesystem notifications unavailable in the re-opened store; polling the log", "err", err)
		}
	}
	_, rev := s.core.Revisions()
	s.logger.Warn("re-opened the store now at the path; its watchers re-list, and registrants register again", "revision", rev)
	return nil
}

// followPlace is the background loop's check that the path still names
// the store this process has open, and its retry of a re-open.
func (s *Store) followPlace(ctx context.Context) error {
	if err := s.acquireSlot(ctx); err != nil {
		return err
	}
	defer s.releaseSlot()
	if s.lost == nil {
		err := s.checkPlace()
		if !errors.Is(err, ErrReplaced) {
			return err
		}
		s.markLost(err)
	}
	return s.reopen(ctx)
}
