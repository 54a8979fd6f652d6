package file

import (
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/internal/mvcc"
	"github.com/fsnotify/fsnotify"
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

// Modes of the files and directories a store creates, before the process
// umask: the umask decides, as for every Unix tool, so that users of one
// group can share a store (umask 002 in a setgid group directory). No file
// is kept private: the store holds no secret (the registry keeps only the
// SHA-256 of its secrets), and who may read or change the store is who may
// read or write its directory.
const (
	filePerm = 0o666
	dirPerm  = 0o777
)

// Store is a store.Store kept in a directory and shared by the processes of
// one host. Its in-memory state (keys, revisions, the history window,
// watches, the keys of each lease) is the MVCC core (store/internal/mvcc),
// fed from the log; the store adds the log, snapshots, lease files and the
// locking between processes. Create it with Open; Close it to release its
// files and goroutines.
//
// Lock order: wslot, the lock file's flock, tmu, a lease file's flock, the
// core's lock, lmu. Waits for wslot and the flocks end with the caller's
// context or Close (lock.go).
type Store struct {
	cfg    Config
	dir    string
	logger *slog.Logger

	lockf *os.File      // flock target: every change holds LOCK_EX on it
	wslot chan struct{} // this process's writers take turns (flock is per open file)

	tmu      sync.Mutex // the log reader: seg, segFirst, segOff; every change to core
	seg      *os.File
	segFirst int64
	segOff   int64
	// lost, when set, says why the directory at the path is no longer
	// the one this process opened (identity.go). Written holding wslot
	// and tmu, read holding either.
	lost error
	// warnedShort: a log shorter than read was logged (warnShortLog).
	warnedShort bool

	core *mvcc.Store

	lmu       sync.Mutex // guards leaseTTLs and leaseDeadlines
	leaseTTLs map[store.LeaseID]time.Duration
	// leaseDeadlines are the deadlines last read from the lease files
	// (a deadline only moves forward: see expireDue).
	leaseDeadlines map[store.LeaseID]time.Time

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
		leaseTTLs:      make(map[store.LeaseID]time.Duration),
		leaseDeadlines: make(map[store.LeaseID]time.Time),
		kick:           make(chan struct{}, 1),
		wslot:          make(chan struct{}, 1),
	}
	// The history window is kept by the log's compaction records.
	s.core = mvcc.New(mvcc.Config{LeaseAlive: s.leaseAlive})
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
	if err := os.MkdirAll(s.dir, dirPerm); err != nil {
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
	s.lockf, err = os.OpenFile(s.path(lockName), os.O_RDWR|os.O_CREATE, filePerm)
	if err != nil {
		return fmt.Errorf("file: store directory %s is not writable (%w): every process of the store needs to create and lock files there; fix its permissions or choose another %s", s.dir, err, EnvDir)
	}
	if err := s.waitLock(ctx, s.lockf, s.lockf.Name()); err != nil {
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
		if err := os.MkdirAll(s.path(d), dirPerm); err != nil {
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
		s.core.Install(snap.rev, max(snap.compact, 1), snap.kvs)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("file: cannot read %s: %w", s.path(snapshotName), err)
	}
	firsts, err := s.segments()
	if err != nil {
		return err
	}
	_, rev := s.core.Revisions()
	if len(firsts) == 0 {
		return s.createSegment(rev + 1)
	}
	if firsts[0] > rev+1 {
		return fmt.Errorf("%w: the log starts at revision %d but the state is at revision %d", ErrCorrupt, firsts[0], rev)
	}
	s.core.CompactTo(firsts[0]) // the events below it are gone
	if err := s.openSegment(firsts[0]); err != nil {
		return err
	}
	return s.catchUp(true)
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
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, filePerm)
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
		if err := s.apply(rec); err != nil {
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
	s.core.Install(snap.rev, snap.rev+1, snap.kvs) // the events in between are gone
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

// apply applies one log record to the in-memory state. The caller holds
// tmu (or is single-threaded in Open).
func (s *Store) apply(rec record) error {
	switch rec.kind {
	case recCompact:
		s.core.CompactTo(rec.rev)
	case recCommit:
		if err := s.core.Apply(rec.rev, rec.events); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, s.seg.Name(), err)
		}
	}
	return nil
}

func (s *Store) funlock() { _ = unlockFile(s.lockf) }

// lockInPlace takes the store's lock, on the store now at the path: if
// the directory was replaced, it re-opens the new one first (identity.go),
// so that no write lands in a log nobody reads any more. The caller holds
// the write slot.
func (s *Store) lockInPlace(ctx context.Context) error {
	for {
		if s.core.Closed() {
			return store.ErrClosed
		}
		if s.lost != nil {
			if err := s.reopen(ctx); err != nil {
				return err
			}
		}
		if err := s.waitLock(ctx, s.lockf, s.lockf.Name()); err != nil {
			return err
		}
		err := s.checkPlace()
		if err == nil {
			return nil
		}
		s.funlock()
		if !errors.Is(err, ErrReplaced) {
			return err
		}
		s.markLost(err)
	}
}

func unlockFile(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }

// locked runs fn holding the write lock (in-process and on the file),
// with the in-memory state caught up with the log. A caller whose context
// ends while it waits gets an error naming the lock, and fn does not run:
// a write is never applied after its caller gave up.
func (s *Store) locked(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.acquireSlot(ctx); err != nil {
		return err
	}
	defer s.releaseSlot()
	if err := s.lockInPlace(ctx); err != nil {
		return err
	}
	defer s.funlock()
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if err := s.catchUp(true); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn()
}

// writeAt writes to the log; tests replace it to tear a write.
var writeAt = func(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }

// appendLocked writes rec at the end of the log, syncs it, and applies it.
// The caller holds the write lock.
func (s *Store) appendLocked(rec record) error {
	if err := s.checkLogSize(); err != nil {
		return err
	}
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
	return s.apply(rec)
}

// checkLogSize refuses to append to a segment that is not as long as this
// process has read it: caught up under the lock, the segment ends exactly
// at segOff, unless it was truncated (or rewritten) under the live
// processes, and a write at segOff would leave a hole that every process
// opening the store later refuses as damage. The caller holds the write
// lock.
func (s *Store) checkLogSize() error {
	fi, err := s.seg.Stat()
	if err != nil {
		return fmt.Errorf("file: cannot stat %s: %w", s.seg.Name(), err)
	}
	if fi.Size() != s.segOff {
		return fmt.Errorf("%w: %s is %d bytes, but this process has read it to offset %d: the log was truncated or changed under the live processes; not writing to it. Stop the processes using the store, move the directory away and restore it from a backup",
			ErrCorrupt, s.seg.Name(), fi.Size(), s.segOff)
	}
	return nil
}

// warnShortLog logs, once, a log segment shorter than this process has
// read it, so that a damaged log is not silent in a process that does not
// write (a writer refuses it: checkLogSize).
func (s *Store) warnShortLog() {
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if s.seg == nil || s.lost != nil || s.warnedShort {
		return
	}
	if fi, err := s.seg.Stat(); err == nil && fi.Size() < s.segOff {
		s.warnedShort = true
		s.logger.Warn("the log was truncated under this process; writes to it are refused: stop the processes using the store, move the directory away and restore it from a backup",
			"segment", s.seg.Name(), "size", fi.Size(), "read_to", s.segOff)
	}
}

// commit writes c as the next revision, if it changes anything, under the
// write lock, and returns that revision (or the current one).
func (s *Store) commit(ctx context.Context, c mvcc.Change) (int64, error) {
	if err := c.Err(); err != nil {
		return 0, err
	}
	var rev int64
	err := s.locked(ctx, func() error {
		var changed bool
		var err error
		if rev, changed, err = s.commitLocked(c); err != nil || !changed {
			return err
		}
		return s.maybeCompactLocked()
	})
	return rev, err
}

// commitLocked checks c against the caught-up state and, if it changes
// anything, appends its events to the log as the next revision and applies
// them. The caller holds the write lock.
func (s *Store) commitLocked(c mvcc.Change) (rev int64, changed bool, err error) {
	b, err := s.core.Prepare(c)
	if err != nil || len(b.Events) == 0 {
		return b.Rev, false, err
	}
	if err := s.appendLocked(record{kind: recCommit, rev: b.Rev, events: b.Events}); err != nil {
		return 0, false, err
	}
	return b.Rev, true, nil
}

// maybeCompactLocked truncates the log when it holds twice the history, in
// revisions or in bytes, down to the history.
func (s *Store) maybeCompactLocked() error {
	revs, bytes := s.core.HistorySize()
	if revs <= 2*int64(s.cfg.History) && bytes <= 2*s.cfg.HistoryBytes {
		return nil
	}
	compact, _ := s.core.Revisions()
	if w := s.core.Window(int64(s.cfg.History), s.cfg.HistoryBytes); w > compact {
		return s.rotateLocked(w)
	}
	return nil // the current revision alone is over the bound: it stays whole
}

// rotateLocked compacts to watermark w: it writes a snapshot of the current
// state, starts a new log segment, and deletes the segments whose events
// are all below w. The caller holds the write lock.
func (s *Store) rotateLocked(w int64) error {
	var snap snapshot
	snap.rev, snap.compact, snap.kvs = s.core.Snapshot()
	snap.compact = max(w, snap.compact)
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
	if err := writeSynced(tmp, data); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
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
	if err := s.core.Usable(ctx); err != nil {
		return err
	}
	s.tmu.Lock()
	defer s.tmu.Unlock()
	return s.syncLocked()
}

// syncLocked is sync with tmu held.
func (s *Store) syncLocked() error {
	switch {
	case s.core.Closed():
		return store.ErrClosed
	case s.lost != nil:
		return fmt.Errorf("%w; this process re-opens the store at the path as soon as there is one", s.lost)
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

// Get implements store.Reader.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.KeyValue{}, err
	}
	if err := s.read(ctx); err != nil {
		return store.KeyValue{}, err
	}
	return s.core.Get(ctx, key)
}

// List implements store.Reader.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, 0, err
	}
	if err := s.read(ctx); err != nil {
		return nil, 0, err
	}
	return s.core.List(ctx, prefix)
}

// Create implements store.Writer.
func (s *Store) Create(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.commit(ctx, mvcc.Create(key, value, opts))
}

// Put implements store.Writer.
func (s *Store) Put(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.commit(ctx, mvcc.Put(key, value, opts))
}

// Update implements store.Writer.
func (s *Store) Update(ctx context.Context, key string, value []byte, modRevision int64, opts ...store.WriteOption) (int64, error) {
	return s.commit(ctx, mvcc.Update(key, value, modRevision, opts))
}

// Delete implements store.Writer.
func (s *Store) Delete(ctx context.Context, key string, opts ...store.DeleteOption) (int64, error) {
	return s.commit(ctx, mvcc.Delete(key, opts))
}

// Txn implements store.Transactor: every precondition is checked and every
// op applied at one revision, under the lock, in one log record.
func (s *Store) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	return s.commit(ctx, mvcc.Txn(ops))
}

// Compact implements store.Compactor: watches (in every process) from
// revisions below rev fail with store.ErrCompacted afterwards, and the log
// segments holding only older revisions are deleted.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	return s.locked(ctx, func() error {
		if err := s.core.CheckCompact(rev); err != nil {
			return err
		}
		return s.rotateLocked(rev)
	})
}

// Close stops the store's goroutines, ends its watches and closes its
// files. It is idempotent; later calls fail with store.ErrClosed. Data
// stays in the directory, and leases stay until they expire.
func (s *Store) Close() error {
	s.core.Close()
	s.closeOnce.Do(func() {
		if s.notifier != nil {
			_ = s.notifier.Close()
		}
	})
	s.wg.Wait()
	s.wslot <- struct{}{} // every wait for it ends on Close
	s.tmu.Lock()
	s.closeFiles()
	s.tmu.Unlock()
	<-s.wslot
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
		<-s.core.Done()
		cancel()
	}()
	s.reapExpired(ctx)
	for {
		select {
		case <-s.core.Done():
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
			// While the store is lost, reads and writes report it.
			if err := s.followPlace(ctx); err != nil && !errors.Is(err, ErrReplaced) && !errors.Is(err, store.ErrClosed) && ctx.Err() == nil {
				s.logger.Warn("cannot check the store directory", "err", err)
			}
			s.warnShortLog()
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
