package file

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/internal/mvcc"
)

// Leases are files in leases/, named by the lease ID in hex and holding the
// TTL. A lease's deadline is the file's modification time plus its TTL:
// KeepAlive touches the file. Any process may end an expired lease: under
// the write lock it deletes the lease's keys in one revision and removes the
// file. Expiry does not wait for some process to touch the directory at the
// right moment: every process that has the store open ends expired leases
// on a timer (ReapInterval, below any TTL), and every read (Get, List, so
// also the snapshot a watch starts from) first ends the leases of its keys
// whose deadline has passed. A crashed process's keys are therefore never
// read after its lease's deadline, by any process, and watchers see them
// deleted within ReapInterval of it.

func (s *Store) leasePath(id store.LeaseID) string {
	return s.path(leaseDir, fmt.Sprintf("%016x", uint64(id)))
}

// leaseState reads a lease: whether it exists, whether it has expired, and
// its TTL. A lease file that cannot be parsed counts as expired, so that it
// is cleaned up with its keys.
func (s *Store) leaseState(id store.LeaseID) (exists, expired bool, ttl time.Duration, err error) {
	fi, err := os.Stat(s.leasePath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return false, false, 0, nil
	}
	if err != nil {
		return false, false, 0, fmt.Errorf("file: cannot read lease %x: %w", id, err)
	}
	s.lmu.Lock()
	ttl, ok := s.leaseTTLs[id]
	s.lmu.Unlock()
	if !ok {
		b, err := os.ReadFile(s.leasePath(id))
		if errors.Is(err, fs.ErrNotExist) {
			return false, false, 0, nil
		}
		if err != nil {
			return false, false, 0, fmt.Errorf("file: cannot read lease %x: %w", id, err)
		}
		if ttl, err = parseLease(b); err != nil {
			s.logger.Warn("lease file is damaged; ending the lease", "lease", fmt.Sprintf("%x", id), "err", err)
			return true, true, 0, nil
		}
		s.lmu.Lock()
		s.leaseTTLs[id] = ttl
		s.lmu.Unlock()
	}
	deadline := fi.ModTime().Add(ttl)
	s.lmu.Lock()
	s.leaseDeadlines[id] = deadline
	s.lmu.Unlock()
	return true, time.Now().After(deadline), ttl, nil
}

// expireDue ends, before a read, every lease that keys are bound to and
// whose deadline has passed (or whose file is gone), so that no read
// returns the keys of a dead process. Leases whose last known deadline is
// still ahead cost nothing: a deadline only moves forward (KeepAlive), so
// only the others are looked at on disk, and the lock is taken only when
// one has really expired.
func (s *Store) expireDue(ctx context.Context) error {
	now := time.Now()
	var check []store.LeaseID
	s.core.ForEachLease(func(id store.LeaseID) {
		s.lmu.Lock()
		d, ok := s.leaseDeadlines[id]
		s.lmu.Unlock()
		if !ok || !now.Before(d) {
			check = append(check, id)
		}
	})
	var due []store.LeaseID
	for _, id := range check {
		exists, expired, _, err := s.leaseState(id)
		if err != nil {
			return err
		}
		if !exists || expired {
			due = append(due, id)
		}
	}
	for _, id := range due {
		if err := s.endIfExpired(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// endIfExpired ends lease id under the write lock if it is still expired
// (or gone with keys still bound to it) once the lock is held.
func (s *Store) endIfExpired(ctx context.Context, id store.LeaseID) error {
	return s.locked(ctx, func() error {
		exists, expired, _, err := s.leaseState(id)
		if err != nil || (exists && !expired) {
			return err // renewed meanwhile
		}
		orphan := !exists && s.core.HasKeys(id)
		if !exists && !orphan {
			return nil // ended by another process meanwhile
		}
		return s.endLeaseLocked(ctx, id, true)
	})
}

// leaseAlive is the core's check of a lease a write binds a key to: the
// write holds the write lock, so no process can end the lease before the
// write is in the log. It runs under the core's lock.
func (s *Store) leaseAlive(id store.LeaseID) error {
	exists, expired, _, err := s.leaseState(id)
	switch {
	case err != nil:
		return err
	case !exists:
		return fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
	case expired:
		s.wakeReaper()
		return fmt.Errorf("%w: lease %x expired", store.ErrLeaseNotFound, id)
	}
	return nil
}

func (s *Store) wakeReaper() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Grant implements store.Leaser. The TTL is kept to the millisecond.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateTTL(ttl); err != nil {
		return store.Lease{}, err
	}
	ttl = ttl.Round(time.Millisecond)
	b, _ := json.Marshal(leaseInfo{TTLMillis: ttl.Milliseconds()})
	var lease store.Lease
	// Under the lock, because Open removes temporary files left by crashes.
	err := s.locked(ctx, func() error {
		for range 10 {
			var r [8]byte
			_, _ = rand.Read(r[:])
			id := store.LeaseID(binary.LittleEndian.Uint64(r[:]) >> 1)
			if id == store.NoLease {
				continue
			}
			tmp := s.path(leaseDir, "lease"+tmpInfix+randHex())
			if err := writeSynced(tmp, b); err != nil {
				return fmt.Errorf("file: cannot grant a lease: %w", err)
			}
			// Link fails if the name exists, so IDs are never reused.
			err := os.Link(tmp, s.leasePath(id))
			_ = os.Remove(tmp)
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("file: cannot grant a lease: %w", err)
			}
			if err := syncDir(s.path(leaseDir)); err != nil {
				return err
			}
			s.lmu.Lock()
			s.leaseTTLs[id] = ttl
			s.lmu.Unlock()
			lease = store.Lease{ID: id, TTL: ttl}
			return nil
		}
		return errors.New("file: cannot grant a lease: no free lease ID after 10 attempts")
	})
	return lease, err
}

// writeSynced creates p (which must not exist) holding b, synced to disk;
// on failure it leaves no file behind.
func writeSynced(p string, b []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, filePerm)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(p)
	}
	return err
}

// KeepAlive implements store.Leaser. It does not take the store's write
// lock (writers may hold it through an fsync), only a lock on the lease
// file, which a reaper also takes before ending the lease.
func (s *Store) KeepAlive(ctx context.Context, id store.LeaseID) (time.Duration, error) {
	if err := s.core.Usable(ctx); err != nil {
		return 0, err
	}
	f, err := os.Open(s.leasePath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
	}
	if err != nil {
		return 0, fmt.Errorf("file: cannot renew lease %x: %w", id, err)
	}
	defer f.Close()
	if err := s.waitLock(ctx, f, f.Name()); err != nil {
		return 0, err
	}
	defer func() { _ = unlockFile(f) }()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("file: cannot renew lease %x: %w", id, err)
	}
	if st.Nlink == 0 { // ended while we waited for the lock
		return 0, fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
	}
	exists, expired, ttl, err := s.leaseState(id)
	switch {
	case err != nil:
		return 0, err
	case !exists:
		return 0, fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
	case expired:
		s.wakeReaper()
		return 0, fmt.Errorf("%w: lease %x expired", store.ErrLeaseNotFound, id)
	}
	now := time.Now()
	if err := os.Chtimes(s.leasePath(id), now, now); err != nil {
		return 0, fmt.Errorf("file: cannot renew lease %x: %w", id, err)
	}
	return ttl, nil
}

// Revoke implements store.Leaser.
func (s *Store) Revoke(ctx context.Context, id store.LeaseID) error {
	return s.locked(ctx, func() error {
		exists, _, _, err := s.leaseState(id)
		if err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
		}
		return s.endLeaseLocked(ctx, id, false)
	})
}

// endLeaseLocked deletes the lease's keys in one revision, then the lease
// file. A crash in between leaves a lease file without keys, which the
// next reaper removes. The caller holds the write lock.
func (s *Store) endLeaseLocked(ctx context.Context, id store.LeaseID, onlyIfExpired bool) error {
	// Exclude a concurrent KeepAlive: it holds the lease file's lock
	// while it checks the deadline and renews. A KeepAlive stopped while
	// it holds it must not stop the store: the wait ends with ctx.
	if f, err := os.Open(s.leasePath(id)); err == nil {
		defer f.Close()
		if err := s.waitLock(ctx, f, f.Name()); err != nil {
			return err
		}
		defer func() { _ = unlockFile(f) }()
		if onlyIfExpired {
			if exists, expired, _, err := s.leaseState(id); err != nil || (exists && !expired) {
				return err // renewed meanwhile
			}
		}
	}
	if _, _, err := s.commitLocked(mvcc.EndLease(id)); err != nil {
		return err
	}
	if err := os.Remove(s.leasePath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("file: cannot remove lease %x: %w", id, err)
	}
	s.lmu.Lock()
	delete(s.leaseTTLs, id)
	delete(s.leaseDeadlines, id)
	s.lmu.Unlock()
	if err := syncDir(s.path(leaseDir)); err != nil {
		return err
	}
	return s.maybeCompactLocked()
}

// reapExpired ends every expired lease (of any process), and every lease
// that keys are bound to but whose file is gone.
func (s *Store) reapExpired(ctx context.Context) {
	entries, err := os.ReadDir(s.path(leaseDir))
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("cannot scan leases", "err", err)
		}
		return
	}
	var due []store.LeaseID
	present := make(map[store.LeaseID]bool, len(entries))
	for _, e := range entries {
		if strings.Contains(e.Name(), tmpInfix) {
			continue
		}
		n, err := strconv.ParseUint(e.Name(), 16, 64)
		if err != nil || n == 0 || n > 1<<63-1 {
			continue
		}
		id := store.LeaseID(n)
		present[id] = true
		if _, expired, _, err := s.leaseState(id); err == nil && expired {
			due = append(due, id)
		}
	}
	s.core.ForEachLease(func(id store.LeaseID) {
		if !present[id] {
			due = append(due, id) // orphaned keys
		}
	})
	for _, id := range due {
		err := s.endIfExpired(ctx, id)
		if err != nil && ctx.Err() == nil && !errors.Is(err, store.ErrClosed) {
			s.logger.Warn("cannot end an expired lease", "lease", fmt.Sprintf("%x", id), "err", err)
		}
	}
}
