//go:build linux && beacon_fsync_delay

// Package fileutil replaces etcd's go.etcd.io/etcd/client/pkg/v3/fileutil
// sync_linux.go in the slow-disk build of the etcd member binary (see
// doc.go in this directory): Fdatasync, which etcd's WAL calls to make
// every raft entry durable, waits for a delay read from a file before it
// syncs, so that a drill can make one member's disk slow and fast again
// while it runs. Fsync is etcd's own.
package fileutil

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// delayFileEnv names the file that holds the delay: a Go duration ("500ms"),
// empty or absent for none. The member writes "<file>.hooked" at start, so
// that a drill can tell a member that honours the file from one that does
// not.
const delayFileEnv = "BEACON_ETCD_FSYNC_DELAY_FILE"

var (
	delayOnce sync.Once
	delay     atomic.Int64 // nanoseconds
)

// watchDelay reads the delay file every 20 ms for the life of the process.
func watchDelay() {
	path := os.Getenv(delayFileEnv)
	if path == "" {
		return
	}
	_ = os.WriteFile(path+".hooked", []byte(strconv.Itoa(os.Getpid())), 0o644)
	read := func() {
		b, err := os.ReadFile(path)
		d, perr := time.ParseDuration(strings.TrimSpace(string(b)))
		if err != nil || perr != nil || d < 0 {
			d = 0
		}
		delay.Store(int64(d))
	}
	read()
	go func() {
		for range time.Tick(20 * time.Millisecond) {
			read()
		}
	}()
}

func init() { delayOnce.Do(watchDelay) }

// Fsync is a wrapper around file.Sync(), as in etcd.
func Fsync(f *os.File) error {
	return f.Sync()
}

// Fdatasync waits for the configured delay, then syncs the file's data as
// etcd's does.
func Fdatasync(f *os.File) error {
	if d := time.Duration(delay.Load()); d > 0 {
		time.Sleep(d)
	}
	return syscall.Fdatasync(int(f.Fd()))
}
