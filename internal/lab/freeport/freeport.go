// Package freeport hands out loopback TCP ports for servers that must be
// told their address before they listen (etcd members name each other's
// URLs in their configuration), unique across every process on the
// machine that uses it: tests (through internal/testkit/etcdtest) and `beacon
// bench`, which must not link the test helpers.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// Ports for servers that must be told their address before they listen
// (etcd members name each other's URLs in their configuration) cannot come
// from binding port 0: the port is free only until the listener closes, the
// kernel may hand the same number out again at once, and it hands ports of
// the ephemeral range to every outgoing connection. Port therefore picks
// ports below the ephemeral range, checks each can be bound, and reserves it
// for the life of the process with a lock file, so that no two callers — in
// this test binary or in another package's, running in parallel — get the
// same port.

var (
	portMu   sync.Mutex
	given    = map[int]bool{}
	reserved []*os.File // lock files held until the process exits
)

// Port returns a loopback TCP port that is free now and that no other
// Port caller, in this process or another on the machine, has been
// given.
func Port() (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	lo, hi := candidateRange()
	dir := filepath.Join(os.TempDir(), "beacon-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return kernelPort()
	}
	for range 500 {
		p := lo + rand.IntN(hi-lo+1)
		if given[p] {
			continue
		}
		f, ok := lockPort(dir, p)
		if !ok {
			continue
		}
		if !bindable(p) {
			f.Close()
			continue
		}
		given[p] = true
		reserved = append(reserved, f)
		return p, nil
	}
	return 0, errors.New("freeport: no free loopback port found below the ephemeral range after 500 tries")
}

// candidateRange is the span of ports below the kernel's ephemeral range.
func candidateRange() (lo, hi int) {
	ephemeralLow := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				ephemeralLow = n
			}
		}
	}
	if ephemeralLow < 12000 {
		// An unusual configuration: stay above the well-known ports.
		return 40000, 60000
	}
	return 10000, ephemeralLow - 1
}

// lockPort takes an exclusive, non-blocking lock on the port's lock file.
func lockPort(dir string, port int) (*os.File, bool) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if !tryLock(f) {
		f.Close()
		return nil, false
	}
	return f, true
}

func bindable(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// kernelPort is the fallback when no lock directory can be made.
func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	p := l.Addr().(*net.TCPAddr).Port
	given[p] = true
	return p, nil
}
