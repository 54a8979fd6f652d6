package file_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/file"
)

// holdLock takes an exclusive flock on path through its own open file, as
// a stopped process holding it would, until release or the test's end.
func holdLock(t *testing.T, path string) (release func()) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	release = func() { _ = f.Close() }
	t.Cleanup(release)
	return release
}

// checkLockError fails unless err is a lock wait that ended with the
// caller's context, naming the lock file and who holds it.
func checkLockError(t *testing.T, what string, err error, lock string) {
	t.Helper()
	switch {
	case !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("%s with the lock held: %v, want the context's deadline", what, err)
	case !strings.Contains(err.Error(), lock) || !strings.Contains(err.Error(), "stopped (SIGSTOP) or hung"):
		t.Fatalf("%s: %q does not name the lock %s and what holds it up", what, err, lock)
	case !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())):
		t.Fatalf("%s: %q does not name the process holding the lock", what, err)
	}
}

func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond) // long enough to reach the wait on a loaded machine
	t.Cleanup(cancel)
	return ctx
}

// TestLockWaitEndsWithTheCallersContext: while another process holds the
// store's lock (stopped, or hung), every operation that needs it, Open
// included, fails when its context ends, with an error naming the lock and
// its holder; and a write whose caller gave up is not applied once the
// lock frees.
func TestLockWaitEndsWithTheCallersContext(t *testing.T) {
	dir := t.TempDir()
	s := open(t, file.Config{Dir: dir})
	defer s.Close()
	ctx := context.Background()
	lease, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(dir, "lock")
	release := holdLock(t, lock)
	for name, op := range map[string]func(context.Context) error{
		"Put":    func(ctx context.Context) error { _, err := s.Put(ctx, "/k", []byte("v")); return err },
		"Create": func(ctx context.Context) error { _, err := s.Create(ctx, "/k", []byte("v")); return err },
		"Txn": func(ctx context.Context) error {
			_, err := s.Txn(ctx, store.Op{Kind: store.OpPut, Key: "/k"})
			return err
		},
		"Grant":   func(ctx context.Context) error { _, err := s.Grant(ctx, time.Minute); return err },
		"Revoke":  func(ctx context.Context) error { return s.Revoke(ctx, lease.ID) },
		"Compact": func(ctx context.Context) error { return s.Compact(ctx, 1) },
		"Open": func(ctx context.Context) error {
			s2, err := file.Open(ctx, file.Config{Dir: dir, MustExist: true})
			if err == nil {
				_ = s2.Close()
			}
			return err
		},
	} {
		checkLockError(t, name, op(shortCtx(t)), lock)
	}
	release()
	if _, err := s.Get(ctx, "/k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the lock freed, Get of a key whose writers gave up: %v, want ErrNotFound", err)
	}
	if _, err := s.KeepAlive(ctx, lease.ID); err != nil {
		t.Fatalf("the lease whose Revoke gave up: %v", err)
	}
}

// TestQueuedWriterHonoursItsContext: a writer queued behind another writer
// of its process that waits for the store's lock gives up with its own
// context, naming the lock; and Close ends the first wait.
func TestQueuedWriterHonoursItsContext(t *testing.T) {
	file.SetLockWarnAfter(t, 0)
	dir := t.TempDir()
	logged := make(chan string, 100)
	s := open(t, file.Config{Dir: dir, Logger: slog.New(signalHandler{slog.DiscardHandler, logged})})
	lock := filepath.Join(dir, "lock")
	holdLock(t, lock)
	first := make(chan error, 1)
	go func() {
		_, err := s.Put(context.Background(), "/first", nil)
		first <- err
	}()
	waitLog(t, logged, "waiting for a lock of the store") // the first Put waits for the flock
	checkLockError(t, "a queued Put", func() error { _, err := s.Put(shortCtx(t), "/second", nil); return err }(), lock)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	deadline := time.After(10 * time.Second)
	select {
	case err := <-first:
		if !errors.Is(err, store.ErrClosed) || !strings.Contains(err.Error(), lock) {
			t.Fatalf("a Put waiting for the lock when the store closed: %v, want ErrClosed naming the lock", err)
		}
	case <-deadline:
		t.Fatal("Close did not end a Put waiting for the store's lock")
	}
	select {
	case <-closed:
	case <-deadline:
		t.Fatal("Close blocked behind a Put waiting for the store's lock")
	}
}

// TestLeaseLockWaitEndsWithTheCallersContext: a process stopped in
// KeepAlive holds its lease file's lock; neither another KeepAlive nor the
// end of the lease (which holds the store's lock meanwhile) waits for it
// longer than its context.
func TestLeaseLockWaitEndsWithTheCallersContext(t *testing.T) {
	dir := t.TempDir()
	s := open(t, file.Config{Dir: dir})
	defer s.Close()
	lease, err := s.Grant(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := filepath.Glob(filepath.Join(dir, "leases", "*"))
	if err != nil || len(leases) != 1 {
		t.Fatalf("lease files: %v (%v)", leases, err)
	}
	holdLock(t, leases[0])
	_, err = s.KeepAlive(shortCtx(t), lease.ID)
	checkLockError(t, "KeepAlive", err, leases[0])
	checkLockError(t, "Revoke", s.Revoke(shortCtx(t), lease.ID), leases[0])
}

// TestLongLockWaitIsLogged: a wait for the store's lock that lasts is
// logged, with the lock file, while it lasts.
func TestLongLockWaitIsLogged(t *testing.T) {
	file.SetLockWarnAfter(t, time.Millisecond)
	dir := t.TempDir()
	var logs syncbuf.Buffer
	s := open(t, file.Config{Dir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer s.Close()
	lock := filepath.Join(dir, "lock")
	holdLock(t, lock)
	_, err := s.Put(shortCtx(t), "/k", nil)
	checkLockError(t, "Put", err, lock)
	if !strings.Contains(logs.String(), "waiting for a lock of the store") || !strings.Contains(logs.String(), lock) {
		t.Fatalf("a long wait for the lock was not logged: %q", logs.String())
	}
}

// signalHandler passes each record's message to a channel, so that a test
// can wait for the moment something is logged.
type signalHandler struct {
	slog.Handler
	ch chan<- string
}

// Enabled passes every record, whatever the wrapped handler keeps.
func (signalHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h signalHandler) Handle(ctx context.Context, r slog.Record) error {
	select {
	case h.ch <- r.Message:
	default:
	}
	return h.Handler.Handle(ctx, r)
}

func (h signalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return signalHandler{h.Handler.WithAttrs(as), h.ch}
}

func (h signalHandler) WithGroup(name string) slog.Handler {
	return signalHandler{h.Handler.WithGroup(name), h.ch}
}

// waitLog waits for a logged message that contains want.
func waitLog(t *testing.T, logged <-chan string, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-logged:
			if strings.Contains(m, want) {
				return
			}
		case <-deadline:
			t.Fatalf("nothing logged with %q", want)
		}
	}
}
