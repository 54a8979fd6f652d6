package file

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/store"
)

// Every wait for a lock in this package goes through waitLock (the store's
// flock, a lease file's flock) or acquireSlot (this process's write slot,
// wslot, in front of the store's flock). A process stopped (SIGSTOP) or hung while it holds the
// store's lock stops every writer of the host, so a wait ends with the
// caller's context or Close, is logged once it has lasted lockWarnAfter,
// and fails with an error naming the lock file and, when /proc/locks tells,
// the process holding it. (tmu and the core's lock are only ever held
// across this process's own reads and writes, never while waiting for
// another process, so they are plain mutexes.)

// lockWarnAfter is how long a wait for a lock lasts before it is logged.
var lockWarnAfter = 5 * time.Second

// lockWait is one wait for the lock file path.
type lockWait struct {
	s      *Store
	what   string // "the store's lock" or "the lease lock"
	path   string
	start  time.Time
	warned bool
}

func (s *Store) newLockWait(path string) *lockWait {
	what := "the store's lock"
	if path != s.path(lockName) {
		what = "the lease lock"
	}
	return &lockWait{s: s, what: what, path: path, start: time.Now()}
}

// tick logs the wait once it has lasted lockWarnAfter.
func (w *lockWait) tick() {
	if w.warned || time.Since(w.start) < lockWarnAfter {
		return
	}
	w.warned = true
	w.s.logger.Warn("waiting for a lock of the store: is a process using the store stopped (SIGSTOP) or hung?",
		"which", w.what, "lock", w.path, "waited", time.Since(w.start).Round(time.Millisecond), "holder", lockHolder(w.path))
}

// fail is the error of a wait that ended with err (the context's error or
// store.ErrClosed).
func (w *lockWait) fail(err error) error {
	return fmt.Errorf("file: %s %s has been held by %s for %v: is a process using the store stopped (SIGSTOP) or hung?: %w",
		w.what, w.path, lockHolder(w.path), time.Since(w.start).Round(time.Millisecond), err)
}

// errClosedWaiting ends a wait for a lock when the store is closed.
var errClosedWaiting = fmt.Errorf("the store was closed while waiting: %w", store.ErrClosed)

// waitLock takes an exclusive flock on f (named path), polling so that
// ctx and Close end the wait.
func (s *Store) waitLock(ctx context.Context, f *os.File, path string) error {
	var w *lockWait
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	delay := 20 * time.Microsecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("file: cannot lock %s: %w", path, err)
		}
		if w == nil {
			w, t = s.newLockWait(path), time.NewTimer(delay)
		} else {
			w.tick()
			t.Reset(delay)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return w.fail(ctx.Err())
		case <-s.core.Done():
			return w.fail(errClosedWaiting)
		}
		delay = min(2*delay, 5*time.Millisecond)
	}
}

// acquireSlot takes this process's write slot (flock is per open file, so
// the goroutines of one process take turns in front of it). The goroutine
// holding it may itself be waiting for the store's lock, so this wait is
// reported as one for that lock.
func (s *Store) acquireSlot(ctx context.Context) error {
	select {
	case s.wslot <- struct{}{}:
		return nil
	default:
	}
	w := s.newLockWait(s.path(lockName))
	warn := time.NewTimer(lockWarnAfter)
	defer warn.Stop()
	for {
		select {
		case s.wslot <- struct{}{}:
			return nil
		case <-warn.C:
			w.tick()
		case <-ctx.Done():
			return w.fail(ctx.Err())
		case <-s.core.Done():
			return w.fail(errClosedWaiting)
		}
	}
}

func (s *Store) releaseSlot() { <-s.wslot }

// lockHolder names the process holding a flock on path, from /proc/locks
// (Linux): "process 1234 (beacon)", or "another process" when it cannot
// tell.
func lockHolder(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "another process"
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return "another process"
	}
	defer f.Close()
	// 1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF
	// A waiter's line has "->" after the number; it does not hold the lock.
	ino := ":" + strconv.FormatUint(st.Ino, 10)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || !strings.HasSuffix(fields[5], ino) {
			continue
		}
		pid := fields[4]
		if pid == strconv.Itoa(os.Getpid()) {
			return "this process (pid " + pid + ")"
		}
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		if name := strings.TrimSpace(string(comm)); name != "" {
			return "process " + pid + " (" + name + ")"
		}
		return "process " + pid
	}
	return "another process"
}
