package file_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store/file"
)

// TestFilesFollowTheUmask: every file and directory a store creates (the
// directory, marker, lock, log segments, snapshot, lease files) takes its
// mode from the process umask, as every Unix tool's does, so that users
// of one group with umask 002 can share a store; with umask 077 nothing is
// readable by others.
func TestFilesFollowTheUmask(t *testing.T) {
	for _, tc := range []struct {
		umask          int
		file, dirPerms fs.FileMode
	}{
		{0o002, 0o664, 0o775},
		{0o077, 0o600, 0o700},
	} {
		old := syscall.Umask(tc.umask)
		dir := filepath.Join(t.TempDir(), "store")
		createEveryFile(t, dir)
		syscall.Umask(old)
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			want := tc.file
			if d.IsDir() {
				want = tc.dirPerms
			}
			if got := fi.Mode().Perm(); got != want {
				t.Errorf("umask %03o: %s has mode %03o, want %03o", tc.umask, p, got, want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// createEveryFile makes a store create every kind of file it has.
func createEveryFile(t *testing.T, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := open(t, file.Config{Dir: dir})
	defer s.Close()
	if _, err := s.Grant(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	rev, err := s.Put(ctx, "/k", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx, rev); err != nil { // a snapshot and a new segment
		t.Fatal(err)
	}
}
