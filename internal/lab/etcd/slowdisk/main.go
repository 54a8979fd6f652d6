// Command slowdisk builds the slow-disk etcd member binary (see package
// etcdproc, SlowDiskModfile): etcd 3.7.3 whose WAL syncs wait for a delay
// read from the file named by BEACON_ETCD_FSYNC_DELAY_FILE, for `beacon
// bench drill --etcd-bin` to give one member a slow disk. Run it from this
// module (it runs the go command):
//
//	go run ./internal/lab/etcd/slowdisk -o ~/.cache/beacon-peers/bin/etcd-slowdisk
//
// It is a test and benchmark tool, not part of the beacon binary.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/beaconplane/beacon/internal/lab/etcdproc"
)

func main() {
	out := flag.String("o", "etcd-slowdisk", "the binary to write")
	work := flag.String("work", "", "directory for the module copy (default: a temporary one, removed)")
	flag.Parse()
	if err := build(*out, *work); err != nil {
		fmt.Fprintln(os.Stderr, "slowdisk:", err)
		os.Exit(1)
	}
}

func build(out, work string) error {
	if work == "" {
		d, err := os.MkdirTemp("", "beacon-slowdisk-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		work = d
	}
	modfile, err := etcdproc.SlowDiskModfile(filepath.Clean(work))
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-modfile", modfile, "-tags", etcdproc.FsyncDelayTag, "-o", out,
		"github.com/beaconplane/beacon/internal/lab/etcd")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}
