package file

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/fsnotify/fsnotify"
	"github.com/google/btree"
)

// Sentinel errors of this package.
var (
	// ErrNotStore reports a directory that is neither empty nor a Beacon
	// store (it has no format marker), or a marker of another format or
	// version.
	ErrNotStore = errors.New("file: not a Beacon file store")
	// ErrCorrupt reports damaged store files that cannot be repaired
	// automatically (anything but a torn write at the end of the log).
	ErrCorrupt = errors.New("file: store files are corrupt")
	// ErrNoStore reports, with Config.MustExist, a directory that does
	// not exist or holds no store yet.
	ErrNoStore = errors.New("file: no Beacon file store")
)

// Names inside the store directory.
const (
	markerName   = "beacon-store.json"
	lockName     = "lock"
	snapshotName = "snapshot"
	walDir       = "wal"
	leaseDir     = "leases"
	tmpInfix     = ".tmp-"
)

// maxBatch bounds the events of one watch response (a revision is never
// split).
const maxBatch = 1000

// Store is a store.Store kept in a directory and shared by the processes of
// one host. Create it with Open; Close it to release its files and
// goroutines.
type Store struct {
	cfg    Config
	dir    string
	logger *slog.Logger

	lockf *os.File   // flock target: every change holds LOCK_EX on it
	wmu   sync.Mutex // this process's writers (flock is per open file)

	tmu      sync.Mutex // the log reader: seg, segFirst, segOff
	seg      *os.File
	segFirst int64
	segOff   int64

	mu        sync.Mutex
	rev       int64
	compact   int64
	data      *btree.BTreeG[*store.KeyValue]
	leaseKeys map[store.LeaseID]map[string]struct{}
	leaseTTLs map[store.LeaseID]time.Duration
	// leaseDeadlines are the deadlines last read from the lease files
	// (a deadline only moves forward: see expireDue).
	leaseDeadlines map[store.LeaseID]time.Time
	events         []store.Event // every event with revision >= compact
	changed        chan struct{} // closed and replaced when the state changes
	closed         bool

	done      chan struct{}
	kick      chan struct{} // wakes the background loop to reap
	wg        sync.WaitGroup
	closeOnce sync.Once
	notifier  *fsnotify.Watcher
}

var (
	_ store.Store      = (*Store)(nil)
	_ store.Compactor  = (*Store)(nil)
	_ store.Transactor = (*Store)(nil)
)

// Open opens the store in cfg.Dir, creating it if the directory is missing
// or empty, and starts following the log for other processes' writes.
// Damaged files are repaired when the damage is a torn write at the end of
// the log (the write was never acknowledged); any other damage is an error
// matching ErrCorrupt.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("file: store directory %q: %w", cfg.Dir, err)
	}
	s := &Store{
		cfg:            cfg,
		dir:            dir,
		logger:         cfg.Logger.With("store", "file", "dir", dir),
		rev:            1,
		compact:        1,
		data:           btree.NewG(32, func(a, b *store.KeyValue) bool { return a.Key < b.Key }),
		leaseKeys:      make(map[store.LeaseID]map[string]struct{}),
		leaseTTLs:      make(map[store.LeaseID]time.Duration),
		leaseDeadlines: make(map[store.LeaseID]time.Time),
		changed:        make(chan struct{}),
		done:           make(chan struct{}),
		kick:           make(chan struct{}, 1),
	}
	if err := s.open(ctx); err != nil {
		s.closeFiles()
		return nil, err
	}
	if !cfg.DisableNotify {
		if w, err := fsnotify.NewWatcher(); err != nil {
			s.logger.Warn("filesystem notifications unavailable; polling the log", "err", err, "interval", cfg.PollInterval)
		} else if err := w.Add(s.path(walDir)); err != nil {
			_ = w.Close()
			s.logger.Warn("filesystem notifications unavailable; polling the log", "err", err, "interval", cfg.PollInterval)
		} else {
			s.notifier = w
		}
	}
	s.wg.Add(1)
	go s.background()
	return s, nil
}

func (s *Store) path(parts ...string) string {
	return filepath.Join(append([]string{s.dir}, parts...)...)
}

func (s *Store) open(ctx context.Context) error {
	if s.cfg.MustExist {
		if err := s.checkExists(); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("file: cannot create store directory %s: %w", s.dir, err)
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("file: cannot read store directory %s: %w", s.dir, err)
	}
	hasMarker, err := s.checkMarker(entries)
	if err != nil {
		return err
	}
	s.lockf, err = os.OpenFile(s.path(lockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("file: store directory %s is not writable (%w): every process of the store needs to create and lock files there; fix its permissions or choose another %s", s.dir, err, EnvDir)
	}
	if err := s.flock(ctx); err != nil {
		return err
	}
	defer s.funlock()
	if !hasMarker {
		// Re-check under the lock: another process may have initialised
		// the directory meanwhile.
		if _, err := os.Stat(s.path(markerName)); errors.Is(err, fs.ErrNotExist) {
			b, _ := json.Marshal(marker{Format: markerFormat, Version: markerVersion, Created: time.Now().UTC()})
			if err := s.writeFileAtomic(markerName, append(b, '\n')); err != nil {
				return fmt.Errorf("file: cannot initialise store in %s: %w", s.dir, err)
			}
		}
	}
	if err := s.recoverFiles(); err != nil {
		return err
	}
	return s.load()
}

// checkExists refuses, for Config.MustExist, a directory that does not
// exist or has no format marker: nothing has ever been stored there, which
// for a reader most likely means a mistyped directory.
func (s *Store) checkExists() error {
	fi, err := os.Stat(s.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s does not exist: check %s (the directory is created by the first process that registers, such as beacon register)",
			ErrNoStore, s.dir, EnvDir)
	case err != nil:
		return fmt.Errorf("file: store directory %s: %w", s.dir, err)
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory: check %s", ErrNotStore, s.dir, EnvDir)
	}
	if _, err := os.Stat(s.path(markerName)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s holds no store yet (no %s): check %s (a store is created by the first process that registers, such as beacon register)",
			ErrNoStore, s.dir, markerName, EnvDir)
	}
	return nil
}

// checkMarker reports whether the directory holds a valid format marker,
// and refuses a foreign directory.
func (s *Store) checkMarker(entries []fs.DirEntry) (bool, error) {
	b, err := os.ReadFile(s.path(markerName))
	switch {
	case err == nil:
		if _, err := parseMarker(b); err != nil {
			return false, fmt.Errorf("%w: %s: %w", ErrNotStore, s.path(markerName), err)
		}
		return true, nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("file: cannot read %s: %w", s.path(markerName), err)
	}
	for _, e := range entries {
		if e.Name() != lockName && !strings.HasPrefix(e.Name(), markerName+tmpInfix) {
			return false, fmt.Errorf("%w: %s is not empty (it holds %q) and has no %s marker; point %s at an empty directory or at an existing Beacon store",
				ErrNotStore, s.dir, e.Name(), markerName, EnvDir)
		}
	}
	return false, nil
}

// recoverFiles removes temporary files left by a crash and makes sure the
// directories exist. The caller holds the lock.
func (s *Store) recoverFiles() error {
	for _, d := range []string{walDir, leaseDir} {
		if err := os.MkdirAll(s.path(d), 0o755); err != nil {
			return fmt.Errorf("file: cannot create %s: %w", s.path(d), err)
		}
	}
	for _, d := range []string{".", leaseDir} {
		entries, err := os.ReadDir(s.path(d))
		if err != nil {
			return fmt.Errorf("file: cannot read %s: %w", s.path(d), err)
		}
		for _, e := range entries {
			if strings.Contains(e.Name(), tmpInfix) {
				// A temporary file is never the only copy of anything:
				// it is renamed into place only when complete.
				p := s.path(d, e.Name())
				if err := os.Remove(p); err == nil {
					s.logger.Warn("removed a temporary file left by an interrupted write", "file", p)
				}
			}
		}
	}
	return nil
}

// segments returns the first revisions of the log segments, in order.
func (s *Store) segments() ([]int64, error) {
	entries, err := os.ReadDir(s.path(walDir))
	if err != nil {
		return nil, fmt.Errorf("file: cannot read %s: %w", s.path(walDir), err)
	}
	var firsts []int64
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(name, 10, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%w: unexpected file %s in the log directory", ErrCorrupt, s.path(walDir, e.Name()))
		}
		firsts = append(firsts, n)
	}
	slices.Sort(firsts)
	return firsts, nil
}

func segName(first int64) string { return fmt.Sprintf("%020d.log", first) }

// load reads the snapshot and the log into memory. The caller holds the
// lock, so a torn record at the end of the log is repaired.
func (s *Store) load() error {
	b, err := os.ReadFile(s.path(snapshotName))
	switch {
	case err == nil:
		snap, err := decodeSnapshot(b)
		if err != nil {
			return fmt.Errorf("%w: %s: %v; move the directory away and restore it from a backup", ErrCorrupt, s.path(snapshotName), err)
		}
		s.installSnapshot(snap)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("file: cannot read %s: %w", s.path(snapshotName), err)
	}
	firsts, err := s.segments()
	if err != nil {
		return err
	}
	if len(firsts) == 0 {
		return s.createSegment(s.rev + 1)
	}
	if firsts[0] > s.rev+1 {
		return fmt.Errorf("%w: the log starts at revision %d but the state is at revision %d", ErrCorrupt, firsts[0], s.rev)
	}
	if firsts[0] > s.compact {
		s.compact = firsts[0]
	}
	if err := s.openSegment(firsts[0]); err != nil {
		return err
	}
	return s.catchUp(true)
}

func (s *Store) installSnapshot(snap snapshot) {
	s.data.Clear(false)
	clear(s.leaseKeys)
	for i := range snap.kvs {
		kv := snap.kvs[i]
		s.data.ReplaceOrInsert(&kv)
		s.bindLocked(kv.Key, kv.Lease)
	}
	s.rev = snap.rev
	s.compact = max(snap.compact, 1)
	s.events = nil
}

func (s *Store) openSegment(first int64) error {
	f, err := os.OpenFile(s.path(walDir, segName(first)), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	magic := make([]byte, len(segmentMagic))
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != segmentMagic {
		_ = f.Close()
		return fmt.Errorf("%w: %s is not a Beacon log segment", ErrCorrupt, f.Name())
	}
	if s.seg != nil {
		_ = s.seg.Close()
	}
	s.seg, s.segFirst, s.segOff = f, first, int64(len(segmentMagic))
	return nil
}

// createSegment creates an empty segment whose first revision is first and
// makes it the one appended to. The caller holds the lock.
func (s *Store) createSegment(first int64) error {
	p := s.path(walDir, segName(first))
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("file: cannot create log segment %s: %w", p, err)
	}
	if _, err := f.Write([]byte(segmentMagic)); err != nil {
		_ = f.Close()
		return fmt.Errorf("file: cannot write log segment %s: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("file: cannot sync log segment %s: %w", p, err)
	}
	if err := syncDir(s.path(walDir)); err != nil {
		_ = f.Close()
		return err
	}
	if s.seg != nil {
		_ = s.seg.Close()
	}
	s.seg, s.segFirst, s.segOff = f, first, int64(len(segmentMagic))
	return nil
}

// catchUp applies the log records written since the last call. With
// locked (the caller holds the write lock, so no write is in progress) a
// torn record at the end of the log is cut off, and a segment missing
// after a seal is created; without it, an incomplete record is left for a
// later call. The caller holds tmu (or is single-threaded in Open).
func (s *Store) catchUp(locked bool) error {
	hdr := make([]byte, recHeaderSize)
	for {
		n, err := s.seg.ReadAt(hdr, s.segOff)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("file: cannot read %s: %w", s.seg.Name(), err)
		}
		if n == 0 {
			return nil
		}
		if n < recHeaderSize {
			return s.tornTail(locked, errShort)
		}
		size, err := recordSize(hdr)
		if err != nil {
			return s.tornTail(locked, err)
		}
		buf := make([]byte, size)
		n, err = s.seg.ReadAt(buf, s.segOff)
		if n < size {
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("file: cannot read %s: %w", s.seg.Name(), err)
			}
			return s.tornTail(locked, errShort)
		}
		rec, _, err := decodeRecord(buf)
		if err != nil {
			return s.tornTail(locked, err)
		}
		if rec.kind == recSeal {
			moved, err := s.nextSegment(rec.rev, locked)
			if err != nil || !moved {
				return err
			}
			continue
		}
		s.segOff += int64(size)
		s.mu.Lock()
		err = s.applyLocked(rec)
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// nextSegment moves the reader past a seal to the segment that starts at
// first. It reports false, leaving the reader on the seal, when that
// segment does not exist yet.
func (s *Store) nextSegment(first int64, locked bool) (bool, error) {
	err := s.openSegment(first)
	switch {
	case err == nil:
		return true, nil
	case !errors.Is(err, fs.ErrNotExist):
		return false, err
	case locked:
		// The writer that sealed the segment died before creating the
		// next one.
		return true, s.createSegment(first)
	}
	// Not created yet, or compacted away while this process lagged behind:
	// then the snapshot is past this point, and the process reloads it.
	b, err := os.ReadFile(s.path(snapshotName))
	if err != nil {
		return false, nil
	}
	snap, err := decodeSnapshot(b)
	if err != nil || snap.rev < first {
		return false, nil
	}
	if err := s.openSegment(snap.rev + 1); err != nil {
		return false, nil
	}
	s.mu.Lock()
	s.installSnapshot(snap)
	s.compact = snap.rev + 1 // the events in between are gone
	s.notifyLocked()
	s.mu.Unlock()
	s.logger.Warn("the log was compacted past this process's position; reloaded the snapshot", "revision", snap.rev)
	return true, nil
}

// tornTail handles a record at s.segOff that does not decode.
func (s *Store) tornTail(locked bool, cause error) error {
	if !locked {
		return nil // a write in progress, or a torn write a writer will cut off
	}
	fi, err := s.seg.Stat()
	if err != nil {
		return fmt.Errorf("file: cannot stat %s: %w", s.seg.Name(), err)
	}
	rest := make([]byte, fi.Size()-s.segOff)
	if _, err := s.seg.ReadAt(rest, s.segOff); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("file: cannot read %s: %w", s.seg.Name(), err)
	}
	// A torn write is the last thing in the file: its frame runs past the
	// end, or the bytes are zeros the file system allocated but never
	// wrote. Anything else is damage that truncation would turn into loss.
	size, serr := recordSize(rest)
	torn := errors.Is(serr, errShort) || (serr == nil && size > len(rest)) || !slices.ContainsFunc(rest, func(c byte) bool { return c != 0 })
	if !torn {
		return fmt.Errorf("%w: %s at offset %d: %v, followed by %d more bytes; move the directory away and restore it from a backup",
			ErrCorrupt, s.seg.Name(), s.segOff, cause, len(rest))
	}
	if err := s.seg.Truncate(s.segOff); err != nil {
		return fmt.Errorf("file: cannot repair %s: %w", s.seg.Name(), err)
	}
	if err := s.seg.Sync(); err != nil {
		return fmt.Errorf("file: cannot repair %s: %w", s.seg.Name(), err)
	}
	s.logger.Warn("cut off a torn record at the end of the log (a write interrupted before it was acknowledged)",
		"segment", s.seg.Name(), "offset", s.segOff, "bytes", len(rest))
	return nil
}

// applyLocked applies one record to the in-memory state.
func (s *Store) applyLocked(rec record) error {
	switch rec.kind {
	case recCompact:
		if w := min(rec.rev, s.rev+1); w > s.compact {
			s.compactLocked(w)
		}
		return nil
	case recCommit:
	default:
		return nil
	}
	if rec.rev <= s.rev {
		// Already part of the snapshot's state: history only.
		if rec.rev >= s.compact {
			s.events = append(s.events, rec.events...)
		}
		return nil
	}
	if rec.rev != s.rev+1 {
		return fmt.Errorf("%w: %s: revision %d follows revision %d", ErrCorrupt, s.seg.Name(), rec.rev, s.rev)
	}
	s.rev = rec.rev
	for _, e := range rec.events {
		old, _ := s.data.Get(&store.KeyValue{Key: e.KV.Key})
		if old != nil {
			s.unbindLocked(old.Key, old.Lease)
		}
		if e.Type == store.EventDelete {
			s.data.Delete(&store.KeyValue{Key: e.KV.Key})
			continue
		}
		kv := e.KV
		s.data.ReplaceOrInsert(&kv)
		s.bindLocked(kv.Key, kv.Lease)
	}
	s.events = append(s.events, rec.events...)
	s.notifyLocked()
	return nil
}

func (s *Store) bindLocked(key string, id store.LeaseID) {
	if id == store.NoLease {
		return
	}
	m := s.leaseKeys[id]
	if m == nil {
		m = make(map[string]struct{})
		s.leaseKeys[id] = m
	}
	m[key] = struct{}{}
}

func (s *Store) unbindLocked(key string, id store.LeaseID) {
	if m := s.leaseKeys[id]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(s.leaseKeys, id)
		}
	}
}

func (s *Store) notifyLocked() {
	if s.closed {
		return
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Store) compactLocked(rev int64) {
	s.compact = rev
	i := sort.Search(len(s.events), func(i int) bool { return s.events[i].KV.ModRevision >= rev })
	if i >= len(s.events)/2 {
		s.events = slices.Clone(s.events[i:])
	} else {
		s.events = s.events[i:]
	}
}

// flock takes the store's exclusive file lock, polling so that ctx can
// cancel the wait.
func (s *Store) flock(ctx context.Context) error {
	delay := 20 * time.Microsecond
	for {
		err := syscall.Flock(int(s.lockf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("file: cannot lock %s: %w", s.lockf.Name(), err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 5*time.Millisecond)
	}
}

func (s *Store) funlock() { _ = syscall.Flock(int(s.lockf.Fd()), syscall.LOCK_UN) }

// locked runs fn holding the write lock (in-process and on the file),
// with the in-memory state caught up with the log.
func (s *Store) locked(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.isClosed() {
		return store.ErrClosed
	}
	if err := s.flock(ctx); err != nil {
		return err
	}
	defer s.funlock()
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if err := s.catchUp(true); err != nil {
		return err
	}
	return fn()
}

// writeAt writes to the log; tests replace it to tear a write.
var writeAt = func(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }

// appendLocked writes rec at the end of the log, syncs it, and applies it.
// The caller holds the write lock.
func (s *Store) appendLocked(rec record) error {
	b := encodeRecord(rec)
	if _, err := writeAt(s.seg, b, s.segOff); err != nil {
		_ = s.seg.Truncate(s.segOff)
		return fmt.Errorf("file: cannot append to %s: %w", s.seg.Name(), err)
	}
	if err := syscall.Fdatasync(int(s.seg.Fd())); err != nil {
		_ = s.seg.Truncate(s.segOff)
		return fmt.Errorf("file: cannot sync %s: %w", s.seg.Name(), err)
	}
	s.segOff += int64(len(b))
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(rec)
}

// commit runs check against the caught-up state under the write lock; if
// it returns events, they are written as the next revision.
func (s *Store) commit(ctx context.Context, check func(next int64) ([]store.Event, error)) (int64, error) {
	var rev int64
	err := s.locked(ctx, func() error {
		s.mu.Lock()
		next := s.rev + 1
		events, err := check(next)
		s.mu.Unlock()
		if err != nil || len(events) == 0 {
			return err
		}
		if err := s.appendLocked(record{kind: recCommit, rev: next, events: events}); err != nil {
			return err
		}
		rev = next
		return s.maybeCompactLocked()
	})
	return rev, err
}

// maybeCompactLocked truncates the log when it holds twice the history.
func (s *Store) maybeCompactLocked() error {
	s.mu.Lock()
	due := s.rev-s.compact >= 2*int64(s.cfg.History)
	w := s.rev - int64(s.cfg.History) + 1
	s.mu.Unlock()
	if !due {
		return nil
	}
	return s.rotateLocked(w)
}

// rotateLocked compacts to watermark w: it writes a snapshot of the current
// state, starts a new log segment, and deletes the segments whose events
// are all below w. The caller holds the write lock.
func (s *Store) rotateLocked(w int64) error {
	s.mu.Lock()
	snap := snapshot{rev: s.rev, compact: max(w, s.compact)}
	s.data.Ascend(func(kv *store.KeyValue) bool {
		snap.kvs = append(snap.kvs, *kv)
		return true
	})
	s.mu.Unlock()
	if err := s.writeFileAtomic(snapshotName, encodeSnapshot(snap)); err != nil {
		return fmt.Errorf("file: cannot write snapshot: %w", err)
	}
	next := snap.rev + 1
	if err := s.appendLocked(record{kind: recSeal, rev: next}); err != nil {
		return err
	}
	if err := s.createSegment(next); err != nil {
		return err
	}
	if err := s.appendLocked(record{kind: recCompact, rev: snap.compact}); err != nil {
		return err
	}
	firsts, err := s.segments()
	if err != nil {
		return err
	}
	for i := 0; i+1 < len(firsts); i++ {
		if last := firsts[i+1] - 1; last < snap.compact {
			if err := os.Remove(s.path(walDir, segName(firsts[i]))); err != nil {
				return fmt.Errorf("file: cannot remove compacted segment: %w", err)
			}
		}
	}
	return syncDir(s.path(walDir))
}

// writeFileAtomic writes name in the store directory crash-safely: a
// temporary file, fsync, rename, fsync of the directory.
func (s *Store) writeFileAtomic(name string, data []byte) error {
	p := s.path(name)
	tmp := p + tmpInfix + randHex()
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(p))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("file: cannot sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("file: cannot sync directory %s: %w", dir, err)
	}
	return nil
}

func randHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%016x", binary.LittleEndian.Uint64(b[:]))
}

// sync applies other processes' writes before a read, so that a read
// sees every write acknowledged before it started.
func (s *Store) sync(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return store.ErrClosed
	}
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if s.isClosed() {
		return store.ErrClosed
	}
	return s.catchUp(false)
}

// read prepares a read: it catches up with the log and ends the expired
// leases of the keys it could return (leases.go).
func (s *Store) read(ctx context.Context) error {
	if err := s.sync(ctx); err != nil {
		return err
	}
	return s.expireDue(ctx)
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Get implements store.Reader.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.KeyValue{}, err
	}
	if err := s.read(ctx); err != nil {
		return store.KeyValue{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	kv, ok := s.data.Get(&store.KeyValue{Key: key})
	if !ok {
		return store.KeyValue{}, fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	return cloneKV(kv), nil
}

// List implements store.Reader.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, 0, err
	}
	if err := s.read(ctx); err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.KeyValue
	s.data.AscendGreaterOrEqual(&store.KeyValue{Key: prefix}, func(kv *store.KeyValue) bool {
		if !strings.HasPrefix(kv.Key, prefix) {
			return false
		}
		out = append(out, cloneKV(kv))
		return true
	})
	return out, s.rev, nil
}

// Create implements store.Writer.
func (s *Store) Create(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, key, value, store.ApplyWriteOptions(opts), func(old *store.KeyValue) error {
		if old != nil {
			return fmt.Errorf("%w: %q (created at revision %d)", store.ErrKeyExists, key, old.CreateRevision)
		}
		return nil
	})
}

// Put implements store.Writer.
func (s *Store) Put(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, key, value, store.ApplyWriteOptions(opts), func(*store.KeyValue) error { return nil })
}

// Update implements store.Writer.
func (s *Store) Update(ctx context.Context, key string, value []byte, modRevision int64, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, key, value, store.ApplyWriteOptions(opts), func(old *store.KeyValue) error {
		return checkModRevision(key, old, modRevision)
	})
}

func checkModRevision(key string, old *store.KeyValue, want int64) error {
	if old == nil {
		return fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	if old.ModRevision != want {
		return fmt.Errorf("%w: %q was written at revision %d, not %d", store.ErrConflict, key, old.ModRevision, want)
	}
	return nil
}

func (s *Store) write(ctx context.Context, key string, value []byte, o store.WriteOptions, check func(*store.KeyValue) error) (int64, error) {
	if err := store.ValidateWrite(key, value); err != nil {
		return 0, err
	}
	if value == nil {
		value = []byte{}
	}
	return s.commit(ctx, func(next int64) ([]store.Event, error) {
		old, _ := s.data.Get(&store.KeyValue{Key: key})
		if err := check(old); err != nil {
			return nil, err
		}
		if o.KeepLease {
			if old == nil {
				return nil, fmt.Errorf("%w: %q (keeping its lease needs the key)", store.ErrNotFound, key)
			}
			o.Lease = old.Lease
		}
		if o.Lease != store.NoLease {
			if err := s.leaseAliveLocked(o.Lease); err != nil {
				return nil, err
			}
		}
		kv := store.KeyValue{Key: key, Value: bytes.Clone(value), CreateRevision: next, ModRevision: next, Lease: o.Lease}
		if old != nil {
			kv.CreateRevision = old.CreateRevision
		}
		return []store.Event{{Type: store.EventPut, KV: kv}}, nil
	})
}

// Delete implements store.Writer.
func (s *Store) Delete(ctx context.Context, key string, opts ...store.DeleteOption) (int64, error) {
	if err := store.ValidateKey(key); err != nil {
		return 0, err
	}
	o := store.ApplyDeleteOptions(opts)
	return s.commit(ctx, func(next int64) ([]store.Event, error) {
		old, ok := s.data.Get(&store.KeyValue{Key: key})
		if !ok {
			return nil, fmt.Errorf("%w: %q", store.ErrNotFound, key)
		}
		if o.IfModRevision != 0 {
			if err := checkModRevision(key, old, o.IfModRevision); err != nil {
				return nil, err
			}
		}
		return []store.Event{{Type: store.EventDelete, KV: store.KeyValue{Key: key, ModRevision: next}}}, nil
	})
}

// Compact implements store.Compactor: watches (in every process) from
// revisions below rev fail with store.ErrCompacted afterwards, and the log
// segments holding only older revisions are deleted.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	return s.locked(ctx, func() error {
		s.mu.Lock()
		cur, compact := s.rev, s.compact
		s.mu.Unlock()
		switch {
		case rev > cur:
			return fmt.Errorf("store: cannot compact to revision %d: the current revision is %d", rev, cur)
		case rev <= compact:
			return &store.CompactedError{Requested: rev, CompactRevision: compact}
		}
		return s.rotateLocked(rev)
	})
}

func cloneKV(kv *store.KeyValue) store.KeyValue {
	c := *kv
	if kv.Value != nil {
		c.Value = bytes.Clone(kv.Value)
	}
	return c
}

// Close stops the store's goroutines, ends its watches and closes its
// files. It is idempotent; later calls fail with store.ErrClosed. Data
// stays in the directory, and leases stay until they expire.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.done)
		close(s.changed)
		s.mu.Unlock()
		if s.notifier != nil {
			_ = s.notifier.Close()
		}
	})
	s.wg.Wait()
	s.wmu.Lock()
	s.tmu.Lock()
	s.closeFiles()
	s.tmu.Unlock()
	s.wmu.Unlock()
	return nil
}

func (s *Store) closeFiles() {
	if s.seg != nil {
		_ = s.seg.Close()
		s.seg = nil
	}
	if s.lockf != nil {
		_ = s.lockf.Close()
		s.lockf = nil
	}
}

// background follows the log for other processes' writes and reaps
// expired leases.
func (s *Store) background() {
	defer s.wg.Done()
	poll := s.cfg.PollInterval
	var events <-chan fsnotify.Event
	var errs <-chan error
	if s.notifier != nil {
		poll = max(poll, safetyPoll)
		events, errs = s.notifier.Events, s.notifier.Errors
	}
	pollT := time.NewTicker(poll)
	defer pollT.Stop()
	reapT := time.NewTicker(s.cfg.ReapInterval)
	defer reapT.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.done
		cancel()
	}()
	s.reapExpired(ctx)
	for {
		select {
		case <-s.done:
			return
		case err, ok := <-errs:
			if ok {
				s.logger.Warn("filesystem notification error; polling continues", "err", err)
			}
			continue
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
		case <-pollT.C:
		case <-reapT.C:
			s.reapExpired(ctx)
			continue
		case <-s.kick:
			s.reapExpired(ctx)
			continue
		}
		if err := s.sync(ctx); err != nil && !errors.Is(err, store.ErrClosed) && ctx.Err() == nil {
			s.logger.Warn("cannot follow the log", "err", err)
		}
	}
}

// Txn implements store.Transactor: every precondition is checked and every
// op applied at one revision, under the lock, in one log record.
func (s *Store) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	if err := store.ValidateOps(ops); err != nil {
		return 0, err
	}
	var rev int64
	err := s.locked(ctx, func() error {
		s.mu.Lock()
		next := s.rev + 1
		var events []store.Event
		for _, op := range ops {
			old, exists := s.data.Get(&store.KeyValue{Key: op.Key})
			switch {
			case op.IfAbsent && exists:
				s.mu.Unlock()
				return &store.ConflictError{Key: op.Key, Err: store.ErrKeyExists}
			case op.IfModRevision != 0 && !exists:
				s.mu.Unlock()
				return &store.ConflictError{Key: op.Key, Err: store.ErrNotFound}
			case op.IfModRevision != 0 && old.ModRevision != op.IfModRevision:
				s.mu.Unlock()
				return &store.ConflictError{Key: op.Key, Err: store.ErrConflict}
			}
			switch {
			case op.Kind == store.OpPut:
				if op.Lease != store.NoLease {
					if err := s.leaseAliveLocked(op.Lease); err != nil {
						s.mu.Unlock()
						return fmt.Errorf("%w (for %q)", err, op.Key)
					}
				}
				kv := store.KeyValue{Key: op.Key, Value: bytes.Clone(op.Value), CreateRevision: next, ModRevision: next, Lease: op.Lease}
				if kv.Value == nil {
					kv.Value = []byte{}
				}
				if exists {
					kv.CreateRevision = old.CreateRevision
				}
				events = append(events, store.Event{Type: store.EventPut, KV: kv})
			case exists: // a delete of an absent key is a no-op
				events = append(events, store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: op.Key, ModRevision: next}})
			}
		}
		cur := s.rev
		s.mu.Unlock()
		if len(events) == 0 {
			rev = cur
			return nil
		}
		if err := s.appendLocked(record{kind: recCommit, rev: next, events: events}); err != nil {
			return err
		}
		rev = next
		return s.maybeCompactLocked()
	})
	return rev, err
}
