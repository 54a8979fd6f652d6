// Package netcut is a loopback TCP proxy for tests: it sits between
// clients and a server and cuts the network between them (and restores it)
// without stopping the server, so that an outage starts and ends at a
// known moment.
package netcut

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards connections to one upstream address. Cut closes every
// connection and refuses new ones until Restore.
type Proxy struct {
	t        testing.TB
	upstream string
	addr     string

	mu    sync.Mutex
	lis   net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// Start starts a proxy to upstream (host:port) on a free loopback port and
// stops it when the test ends.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	n := &Proxy{t: t, upstream: upstream, conns: map[net.Conn]bool{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = lis.Addr().String()
	n.serve(lis)
	t.Cleanup(func() {
		n.Cut()
		n.wg.Wait()
	})
	return n
}

// Addr is where clients connect.
func (n *Proxy) Addr() string { return n.addr }

func (n *Proxy) serve(lis net.Listener) {
	n.mu.Lock()
	n.lis = lis
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", n.upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			if !n.track(c, up) {
				return
			}
			for _, dir := range [][2]net.Conn{{c, up}, {up, c}} {
				n.wg.Add(1)
				go func() {
					defer n.wg.Done()
					_, _ = io.Copy(dir[0], dir[1])
					_ = dir[0].Close()
					_ = dir[1].Close()
				}()
			}
		}
	}()
}

func (n *Proxy) track(cs ...net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lis == nil {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		n.conns[c] = true
	}
	return true
}

// Cut closes the listener and every connection.
func (n *Proxy) Cut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lis != nil {
		_ = n.lis.Close()
		n.lis = nil
	}
	for c := range n.conns {
		_ = c.Close()
	}
	clear(n.conns)
}

// Restore listens again on the same address.
func (n *Proxy) Restore() {
	lis, err := net.Listen("tcp", n.addr)
	if err != nil {
		n.t.Fatalf("restore %s: %v", n.addr, err)
	}
	n.serve(lis)
}
