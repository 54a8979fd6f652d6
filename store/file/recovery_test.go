package file_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/file"
)

func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "wal", "*.log"))
	if err != nil || len(m) == 0 {
		t.Fatalf("no log segment in %s: %v", dir, err)
	}
	return m[len(m)-1]
}

func appendFile(t *testing.T, p string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

func writeSome(t *testing.T, dir string, n int) int64 {
	t.Helper()
	s := open(t, file.Config{Dir: dir})
	defer s.Close()
	var rev int64
	for i := range n {
		var err error
		if rev, err = s.Put(context.Background(), "/k/"+string(rune('a'+i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	return rev
}

func TestTornTailIsRepaired(t *testing.T) {
	for name, garbage := range map[string][]byte{
		"short header":  {7, 0, 0},
		"short payload": append([]byte{100, 0, 0, 0, 1, 2, 3, 4}, make([]byte, 10)...),
		"zeros":         make([]byte, 4096),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			rev := writeSome(t, dir, 5)
			seg := lastSegment(t, dir)
			before, _ := os.Stat(seg)
			appendFile(t, seg, garbage)
			var logs syncbuf.Buffer
			s := open(t, file.Config{Dir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			defer s.Close()
			kvs, got, err := s.List(context.Background(), "/k/")
			if err != nil || len(kvs) != 5 || got != rev {
				t.Fatalf("after repair: %d keys at %d (%v), want 5 at %d", len(kvs), got, err, rev)
			}
			if after, _ := os.Stat(seg); after.Size() != before.Size() {
				t.Fatalf("segment is %d bytes after repair, want %d", after.Size(), before.Size())
			}
			if !strings.Contains(logs.String(), "torn record") {
				t.Fatalf("repair not logged: %q", logs.String())
			}
			if _, err := s.Put(context.Background(), "/k/z", []byte("after")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestCorruptionInTheMiddleIsAnError(t *testing.T) {
	dir := t.TempDir()
	writeSome(t, dir, 5)
	seg := lastSegment(t, dir)
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[8+8+3] ^= 0xff // inside the payload of the first record
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = file.Open(context.Background(), file.Config{Dir: dir})
	if !errors.Is(err, file.ErrCorrupt) || !strings.Contains(err.Error(), seg) || !strings.Contains(err.Error(), "offset 8") {
		t.Fatalf("Open of a damaged log: %v; want ErrCorrupt naming %s at offset 8", err, seg)
	}
	// Nothing was truncated.
	if after, _ := os.ReadFile(seg); !bytes.Equal(after, b) {
		t.Fatal("Open changed a damaged segment")
	}
}

func TestCorruptSnapshotIsAnError(t *testing.T) {
	dir := t.TempDir()
	s := open(t, file.Config{Dir: dir, History: 5})
	for i := range 20 {
		if _, err := s.Put(context.Background(), "/k", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	p := filepath.Join(dir, "snapshot")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("no snapshot after compaction: %v", err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := file.Open(context.Background(), file.Config{Dir: dir}); !errors.Is(err, file.ErrCorrupt) {
		t.Fatalf("Open with a damaged snapshot: %v", err)
	}
}

func TestForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := file.Open(context.Background(), file.Config{Dir: dir})
	if !errors.Is(err, file.ErrNotStore) || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("Open of a foreign directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "lock")); err == nil {
		t.Fatal("Open wrote into a foreign directory")
	}
	// A marker of another format or version is refused too.
	dir2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir2, "beacon-store.json"), []byte(`{"format":"beacon-file-store","version":9}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := file.Open(context.Background(), file.Config{Dir: dir2}); !errors.Is(err, file.ErrNotStore) || !strings.Contains(err.Error(), "version 9") {
		t.Fatalf("Open with a version-9 marker: %v", err)
	}
}

func TestUnusableDirectory(t *testing.T) {
	// A path below a regular file cannot be a directory.
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := file.Open(context.Background(), file.Config{Dir: filepath.Join(f, "store")}); err == nil || !strings.Contains(err.Error(), "cannot create store directory") {
		t.Fatalf("Open below a file: %v", err)
	}
	if _, err := file.Open(context.Background(), file.Config{}); err == nil || !strings.Contains(err.Error(), file.EnvDir) {
		t.Fatalf("Open without a directory: %v", err)
	}
}

// With MustExist, Open refuses a directory that does not exist or holds no
// store, and creates nothing; a store made by another Open is opened.
func TestMustExist(t *testing.T) {
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "stroe")
	if _, err := file.Open(ctx, file.Config{Dir: missing, MustExist: true}); !errors.Is(err, file.ErrNoStore) ||
		!strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), file.EnvDir) {
		t.Fatalf("Open of a missing directory: %v", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open with MustExist created %s: %v", missing, err)
	}
	empty := t.TempDir()
	if _, err := file.Open(ctx, file.Config{Dir: empty, MustExist: true}); !errors.Is(err, file.ErrNoStore) || !strings.Contains(err.Error(), "holds no store yet") {
		t.Fatalf("Open of an empty directory: %v", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Fatalf("Open with MustExist wrote %v into an empty directory", entries)
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := file.Open(ctx, file.Config{Dir: f, MustExist: true}); !errors.Is(err, file.ErrNotStore) || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("Open of a regular file: %v", err)
	}
	s, err := file.Open(ctx, file.Config{Dir: missing})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = file.Open(ctx, file.Config{Dir: missing, MustExist: true})
	if err != nil {
		t.Fatalf("Open with MustExist of an existing store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// A directory the process may not write to gives an error that says so.
// Root ignores permissions, so as root the check runs in a child process
// with the uid of nobody.
func TestUnwritableDirectory(t *testing.T) {
	base, err := os.MkdirTemp("", "beacon-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	dir := filepath.Join(base, "store")
	if err := os.Mkdir(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		_, err := file.Open(context.Background(), file.Config{Dir: dir})
		if err == nil || !strings.Contains(err.Error(), "not writable") {
			t.Fatalf("Open of a read-only directory: %v", err)
		}
		return
	}
	// Copy the test binary where nobody can execute it.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(base, "file.test")
	dst, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	_, lines := startChildExe(t, bin, "open", dir, "", &syscall.Credential{Uid: 65534, Gid: 65534})
	l := nextLine(t, lines, 30*time.Second)
	if !strings.HasPrefix(l, "error") || !strings.Contains(l, "not writable") {
		t.Fatalf("Open of a read-only directory as nobody: %q", l)
	}
}

func TestDataSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // bounds every wait on a watch
	defer cancel()
	s := open(t, file.Config{Dir: dir})
	first, err := s.Put(ctx, "/a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Put(ctx, "/a", []byte("2"))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, file.Config{Dir: dir})
	defer s.Close()
	kv, err := s.Get(ctx, "/a")
	if err != nil || string(kv.Value) != "2" || kv.CreateRevision != first || kv.ModRevision != second {
		t.Fatalf("after restart: %+v, %v", kv, err)
	}
	// History survives too: a watch resumes from before the restart.
	resp := <-s.Watch(ctx, "/a", first)
	if resp.Err != nil || len(resp.Events) != 2 || resp.Events[0].Revision() != first {
		t.Fatalf("watch from before the restart: %+v", resp)
	}
}

// The log is truncated when it holds twice the history: old segments go,
// a snapshot holds the state, and watches from before the window fail.
func TestHistoryWindowTruncatesTheLog(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // bounds every wait on a watch
	defer cancel()
	s := open(t, file.Config{Dir: dir, History: 10})
	var revs []int64
	for i := range 50 {
		rev, err := s.Put(ctx, "/k/"+string(rune('a'+i%5)), []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.log"))
	if len(segs) > 3 {
		t.Fatalf("%d log segments after truncation, want at most 3: %v", len(segs), segs)
	}
	resp := <-s.Watch(ctx, "/k/", revs[0])
	var ce *store.CompactedError
	if !errors.As(resp.Err, &ce) {
		t.Fatalf("watch from a truncated revision: %+v", resp)
	}
	s.Close()
	s = open(t, file.Config{Dir: dir, History: 10})
	defer s.Close()
	kvs, rev, err := s.List(ctx, "/k/")
	if err != nil || len(kvs) != 5 || rev != revs[49] {
		t.Fatalf("after reopening a truncated log: %d keys at %d, %v", len(kvs), rev, err)
	}
	resp = <-s.Watch(ctx, "/k/", revs[45])
	if resp.Err != nil || resp.Events[0].Revision() != revs[45] {
		t.Fatalf("watch inside the window after reopening: %+v", resp)
	}
}

// A process that did not follow the log while another truncated it twice
// reloads the snapshot, and its watchers get a compaction error.
func TestLaggingProcessReloadsSnapshot(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // bounds every wait on a watch
	defer cancel()
	lag := open(t, file.Config{Dir: dir, DisableNotify: true, PollInterval: time.Hour})
	defer lag.Close()
	_, from, err := lag.List(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	busy := open(t, file.Config{Dir: dir, History: 5})
	defer busy.Close()
	var last int64
	for i := range 60 {
		if last, err = busy.Put(ctx, "/k/"+string(rune('a'+i%3)), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	kvs, rev, err := lag.List(ctx, "/k/")
	if err != nil || len(kvs) != 3 || rev != last {
		t.Fatalf("lagging process: %d keys at %d, %v; want 3 at %d", len(kvs), rev, err, last)
	}
	resp := <-lag.Watch(ctx, "/", from+1)
	if !errors.Is(resp.Err, store.ErrCompacted) {
		t.Fatalf("watch of the lagging process from before the reload: %+v", resp)
	}
}

func TestStaleTempFilesAndDamagedLeaseAreCleanedUp(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := open(t, file.Config{Dir: dir})
	l, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Put(ctx, "/leased", []byte("v"), store.WithLease(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	leases, _ := filepath.Glob(filepath.Join(dir, "leases", "*"))
	if len(leases) != 1 {
		t.Fatalf("lease files: %v", leases)
	}
	if err := os.WriteFile(leases[0], []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "snapshot.tmp-0123")
	if err := os.WriteFile(tmp, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	s = open(t, file.Config{Dir: dir})
	defer s.Close()
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale temporary file still there: %v", err)
	}
	// The damaged lease ends: its key is deleted (at the next revision).
	resp := <-s.Watch(ctx, "/leased", rev+1)
	if resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].Type != store.EventDelete {
		t.Fatalf("damaged lease: %+v", resp)
	}
	_, err = s.KeepAlive(ctx, l.ID)
	if !errors.Is(err, store.ErrLeaseNotFound) {
		t.Fatalf("KeepAlive of the damaged lease: %v", err)
	}
}

// TestHistoryBytesTruncatesTheLog: transactions of many keys fill a history
// bounded in bytes long before the bound in revisions: the writer truncates
// the log down to the bound, and another process following the log compacts
// its window with it.
func TestHistoryBytesTruncatesTheLog(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // bounds every wait on a watch
	defer cancel()
	cfg := file.Config{Dir: dir, HistoryBytes: 16 << 10}
	s := open(t, cfg)
	defer s.Close()
	follower := open(t, cfg)
	defer follower.Close()
	var revs []int64
	for range 40 {
		ops := make([]store.Op, 32)
		for j := range ops {
			ops[j] = store.Op{Kind: store.OpPut, Key: fmt.Sprintf("/k/%d", j), Value: make([]byte, 200)} // about 9 KiB a revision
		}
		rev, err := s.Txn(ctx, ops...)
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.log")); len(segs) > 3 {
		t.Fatalf("%d log segments after truncation, want at most 3: %v", len(segs), segs)
	}
	for name, st := range map[string]*file.Store{"writer": s, "follower": follower} {
		if _, _, err := st.List(ctx, "/"); err != nil { // catches up with the log
			t.Fatal(err)
		}
		resp := <-st.Watch(ctx, "/k/", revs[len(revs)-6])
		var ce *store.CompactedError
		if !errors.As(resp.Err, &ce) {
			t.Fatalf("%s: watch from 6 revisions of 9 KiB ago, with 16 KiB of history: err %v, %d events", name, resp.Err, len(resp.Events))
		}
		resp = <-st.Watch(ctx, "/k/", revs[len(revs)-1])
		if resp.Err != nil || len(resp.Events) != 32 {
			t.Fatalf("%s: watch from the newest revision: err %v, %d events", name, resp.Err, len(resp.Events))
		}
	}
}

// TestHistoryBytesFromTheEnvironment: BEACON_FILE_HISTORY_BYTES sets
// HistoryBytes, and anything but a positive number is refused, naming the
// variable.
func TestHistoryBytesFromTheEnvironment(t *testing.T) {
	t.Setenv(file.EnvDir, t.TempDir())
	t.Setenv(file.EnvHistoryBytes, "1048576")
	if c, err := file.ConfigFromEnv(); err != nil || c.HistoryBytes != 1<<20 {
		t.Fatalf("%s=1048576: HistoryBytes %d, %v", file.EnvHistoryBytes, c.HistoryBytes, err)
	}
	for _, v := range []string{"0", "-5", "64MiB", "lots", "99999999999999999999"} {
		t.Setenv(file.EnvHistoryBytes, v)
		if _, err := file.ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), file.EnvHistoryBytes) {
			t.Errorf("%s=%q: %v, want an error naming the variable", file.EnvHistoryBytes, v, err)
		}
	}
	if err := (file.Config{Dir: "d", HistoryBytes: -1}).Validate(); err == nil {
		t.Error("a negative HistoryBytes is accepted")
	}
}

// TestWriterRefusesALogShortenedUnderIt: a live writer whose log segment
// was truncated under it (by hand, by a tool) does not write at its own
// offset, which would leave a zero-filled hole that every later Open
// refuses: it fails with ErrCorrupt naming the segment, and the file is
// left as it was. A process that only reads logs it.
func TestWriterRefusesALogShortenedUnderIt(t *testing.T) {
	dir := t.TempDir()
	s := open(t, file.Config{Dir: dir})
	defer s.Close()
	for i := range 5 {
		if _, err := s.Put(context.Background(), fmt.Sprintf("/k/%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	logged := make(chan string, 100)
	reader := open(t, file.Config{Dir: dir, DisableNotify: true, PollInterval: time.Millisecond,
		Logger: slog.New(signalHandler{slog.DiscardHandler, logged})})
	defer reader.Close()
	seg := lastSegment(t, dir)
	before, err := os.Stat(seg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(seg, before.Size()/2); err != nil {
		t.Fatal(err)
	}
	waitLog(t, logged, "the log was truncated under this process") // a process that only reads says so
	_, err = s.Put(context.Background(), "/k/after", []byte("v"))
	if !errors.Is(err, file.ErrCorrupt) || !strings.Contains(err.Error(), seg) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("a write to a log truncated under the writer: %v, want ErrCorrupt naming %s", err, seg)
	}
	after, err := os.Stat(seg)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() != before.Size()/2 {
		t.Fatalf("the truncated segment is now %d bytes, want it left at %d", after.Size(), before.Size()/2)
	}
}
