package file_test

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/file"
)

// replaceDir moves dir away (as an operator restoring a backup does) and
// puts a new store there, holding key; it returns that new store.
func replaceDir(t *testing.T, dir, key string) *file.Store {
	t.Helper()
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	fresh := open(t, file.Config{Dir: dir})
	t.Cleanup(func() { _ = fresh.Close() })
	if _, err := fresh.Put(context.Background(), key, []byte("new")); err != nil {
		t.Fatal(err)
	}
	return fresh
}

// TestWatchersOfAReplacedDirectoryEndAndRelist: a process that only
// watches notices, by itself, that the directory at the path was replaced:
// its watches end with ErrReplaced (not silence), it says so in its log,
// and a re-list and a new watch follow the store now at the path.
func TestWatchersOfAReplacedDirectoryEndAndRelist(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir() + "/store"
	logged := make(chan string, 100)
	s := open(t, file.Config{Dir: dir, DisableNotify: true, PollInterval: time.Millisecond,
		Logger: slog.New(signalHandler{slog.DiscardHandler, logged})})
	defer s.Close()
	if _, err := s.Put(ctx, "/r/old", nil); err != nil {
		t.Fatal(err)
	}
	w := s.Watch(ctx, "/r/", 0)
	fresh := replaceDir(t, dir, "/r/new")
	resp, ok := <-w
	if !ok || !errors.Is(resp.Err, file.ErrReplaced) {
		t.Fatalf("the watch of a replaced directory delivered %+v (open %v), want an error matching ErrReplaced", resp, ok)
	}
	waitLog(t, logged, "no longer the one this process opened")
	waitLog(t, logged, "re-opened the store")
	kvs, rev, err := s.List(ctx, "/r/")
	if err != nil || len(kvs) != 1 || kvs[0].Key != "/r/new" {
		t.Fatalf("re-list after the replacement: %v at %d (%v), want only the new store's /r/new", kvs, rev, err)
	}
	w = s.Watch(ctx, "/r/", rev+1)
	if _, err := fresh.Put(ctx, "/r/later", nil); err != nil {
		t.Fatal(err)
	}
	if resp := <-w; resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].KV.Key != "/r/later" {
		t.Fatalf("a watch of the re-opened store got %+v, want the new store's /r/later", resp)
	}
}

// TestWriteAfterReplacementLandsInTheNewDirectory: a writer checks, under
// the lock, that the path still names its store, so a write after the
// directory was replaced goes to the new one (every other process sees
// it), never into the log that was moved away; its lease, which the new
// store does not have, is reported lost, so that it registers again.
func TestWriteAfterReplacementLandsInTheNewDirectory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir() + "/store"
	s := open(t, file.Config{Dir: dir, PollInterval: time.Hour}) // the background never checks
	defer s.Close()
	lease, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "/r/a", []byte("old"), store.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	fresh := replaceDir(t, dir, "/r/b")
	if _, err := s.Put(ctx, "/r/a", []byte("again"), store.WithLease(lease.ID)); !errors.Is(err, store.ErrLeaseNotFound) {
		t.Fatalf("a write bound to a lease of the replaced directory: %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.KeepAlive(ctx, lease.ID); !errors.Is(err, store.ErrLeaseNotFound) {
		t.Fatalf("KeepAlive of a lease of the replaced directory: %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.Put(ctx, "/r/c", []byte("v")); err != nil {
		t.Fatal(err)
	}
	kvs, _, err := fresh.List(ctx, "/r/")
	if err != nil || len(kvs) != 2 || kvs[0].Key != "/r/b" || kvs[1].Key != "/r/c" {
		t.Fatalf("the new store holds %v (%v), want /r/b and the old process's /r/c", kvs, err)
	}
}

// TestRemovedDirectoryIsNotRecreated: a process never creates a store in
// place of one removed under it (the operator decides what comes there):
// its writes fail with ErrReplaced, saying why, until a store is there
// again, then go to it.
func TestRemovedDirectoryIsNotRecreated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir() + "/store"
	s := open(t, file.Config{Dir: dir, PollInterval: time.Hour})
	defer s.Close()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "/k", nil); !errors.Is(err, file.ErrReplaced) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("a write after the directory was removed: %v, want ErrReplaced naming %s", err, dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the removed directory was created again: %v", err)
	}
	fresh := open(t, file.Config{Dir: dir})
	defer fresh.Close()
	if _, err := s.Put(ctx, "/k", nil); err != nil {
		t.Fatalf("a write once a store is at the path again: %v", err)
	}
	if _, err := fresh.Get(ctx, "/k"); err != nil {
		t.Fatalf("the new store does not hold the write: %v", err)
	}
}
