package etcdproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The slow-disk build of the member binary: internal/lab/etcd (etcd 3.7.3's
// etcdmain) against a copy of etcd's client/pkg module whose
// fileutil/sync_linux.go is internal/lab/etcd/fsyncdelay/sync_linux.go, so that
// its WAL syncs wait for the delay Member.SetFsyncDelay sets (see
// EtcdMembers.FsyncDelay). Tests build it with etcdtest.SlowDiskMemberBin;
// `go run ./internal/lab/etcd/slowdisk -o FILE` (or `bash .ci/build-peers
// etcd-slowdisk`) builds it for `beacon bench drill --etcd-bin`.

// memberPkg is the package of the member binary.
const memberPkg = "github.com/beaconplane/beacon/internal/lab/etcd"

// FsyncDelayTag is the build tag of the slow-disk member binary.
const FsyncDelayTag = "beacon_fsync_delay"

// fileutilModule is the etcd module whose fileutil package syncs the WAL.
const fileutilModule = "go.etcd.io/etcd/client/pkg/v3"

// SlowDiskModfile prepares, in dir (made if needed), what building the slow-disk member
// binary needs — a copy of etcd's client/pkg module with the delaying
// fileutil/sync_linux.go, and a go.mod (with go.sum) that is this
// module's plus a replace of that module by the copy — and returns the
// go.mod's path for `go build -modfile`. It runs the go command.
func SlowDiskModfile(dir string) (string, error) {
	goList := func(args ...string) (string, error) {
		out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
		if err != nil {
			return "", fmt.Errorf("go list %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	modDir, err := goList("-m", "-f", "{{.Dir}}", fileutilModule)
	if err != nil {
		return "", err
	}
	self, err := goList("-f", "{{.Dir}}", memberPkg)
	if err != nil {
		return "", err
	}
	root, err := goList("-m", "-f", "{{.Dir}}")
	if err != nil {
		return "", err
	}
	cp := filepath.Join(dir, "client-pkg")
	if err := os.RemoveAll(cp); err != nil {
		return "", err
	}
	if err := os.CopyFS(cp, os.DirFS(modDir)); err != nil {
		return "", err
	}
	hook, err := os.ReadFile(filepath.Join(self, "fsyncdelay", "sync_linux.go"))
	if err != nil {
		return "", err
	}
	target := filepath.Join(cp, "fileutil", "sync_linux.go")
	if err := os.Remove(target); err != nil {
		return "", err
	}
	if err := os.WriteFile(target, hook, 0o644); err != nil {
		return "", err
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		return "", err
	}
	modfile := filepath.Join(dir, "go.mod")
	gomod = fmt.Appendf(gomod, "\nreplace %s => %s\n", fileutilModule, cp)
	if err := os.WriteFile(modfile, gomod, 0o644); err != nil {
		return "", err
	}
	return modfile, os.WriteFile(filepath.Join(dir, "go.sum"), gosum, 0o644)
}
