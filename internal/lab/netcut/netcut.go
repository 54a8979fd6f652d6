// Package netcut is a loopback TCP forwarder that cuts the network between
// clients and one server, and restores it, without stopping the server, so
// that an outage starts and ends at a known moment. Tests and the fault
// drills (internal/lab/drill, `beacon bench drill`) put it in front of an etcd
// member.
//
// While cut it keeps its port and closes every connection it holds and
// every new one at once: clients see their streams break and their dials
// fail, as behind a restarted middlebox, and the port cannot be taken by
// anyone else in the meantime.
package netcut

import (
	"io"
	"net"
	"sync"
)

// Proxy forwards connections to one upstream address until Cut.
type Proxy struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	cut    bool
	closed bool
	conns  map[net.Conn]bool
}

// Start forwards a free loopback port to target (host:port). Close stops
// it.
func Start(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Endpoint is Addr as an etcd client URL.
func (p *Proxy) Endpoint() string { return "http://" + p.Addr() }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Restore forwards new connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy, closing every connection, and waits for its
// goroutines. It may be called more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.l.Close()
	p.Cut()
	p.wg.Wait()
	return nil
}
