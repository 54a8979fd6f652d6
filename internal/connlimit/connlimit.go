// Package connlimit bounds the connections a listener holds open: in all,
// and from one client address, so that a client holding many connections
// (or reopening them as the server closes them) cannot take every place
// from the others.
package connlimit

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// Listener accepts at most max connections at a time: Accept waits while
// max are open, so that further clients wait in the kernel's accept
// queue. Of them, at most perAddr come from one client address (host,
// without the port): one past that is closed at once, without an answer,
// and its place given back (no bound when perAddr <= 0). Each cap reached
// is logged at most once a minute, with listener=what (e.g. "HTTP").
func Listener(ln net.Listener, max, perAddr int, log *slog.Logger, what string) net.Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &listener{Listener: ln, sem: make(chan struct{}, max), perAddr: perAddr, byAddr: map[string]int{}, log: log, what: what}
}

type listener struct {
	net.Listener
	sem     chan struct{}
	perAddr int
	log     *slog.Logger
	what    string

	mu         sync.Mutex
	byAddr     map[string]int
	warned     time.Time
	warnedAddr time.Time
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		select {
		case l.sem <- struct{}{}:
		default:
			l.mu.Lock()
			if time.Since(l.warned) > time.Minute {
				l.warned = time.Now()
				l.log.Warn("connections at their cap: new ones wait until one closes (a flood of connections, or raise the open-file limit)",
					"listener", l.what, "addr", l.Addr().String(), "max", cap(l.sem))
			}
			l.mu.Unlock()
			l.sem <- struct{}{}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.sem
			return nil, err
		}
		host := hostOf(c.RemoteAddr())
		l.mu.Lock()
		if l.perAddr > 0 && l.byAddr[host] >= l.perAddr {
			warn := time.Since(l.warnedAddr) > time.Minute
			if warn {
				l.warnedAddr = time.Now()
			}
			l.mu.Unlock()
			_ = c.Close()
			<-l.sem
			if warn {
				l.log.Warn("connections from one client address at their cap: further ones from it are closed at once (a client holding connections open, or clients behind one address: raise the per-client bound)",
					"listener", l.what, "addr", l.Addr().String(), "client", host, "max_per_client", l.perAddr)
			}
			continue
		}
		l.byAddr[host]++
		l.mu.Unlock()
		return &conn{Conn: c, release: func() {
			l.mu.Lock()
			if l.byAddr[host]--; l.byAddr[host] <= 0 {
				delete(l.byAddr, host)
			}
			l.mu.Unlock()
			<-l.sem
		}}, nil
	}
}

func hostOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// conn gives its places back once, when closed.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
