package server

import (
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// defaultMaxConns is a quarter of the process's open-file limit (Go
// raises the soft limit to the hard one at start), at least 256.
func defaultMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	return int(max(256, min(rl.Cur/4, 1<<20)))
}

// connLimitListener accepts at most n connections at a time; Accept waits
// while n are open, so that further clients wait in the kernel's accept
// queue. Reaching the cap is logged, at most once a minute.
type connLimitListener struct {
	net.Listener
	sem    chan struct{}
	log    *slog.Logger
	mu     sync.Mutex
	warned time.Time
}

func limitConns(ln net.Listener, n int, log *slog.Logger) net.Listener {
	return &connLimitListener{Listener: ln, sem: make(chan struct{}, n), log: log}
}

func (l *connLimitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	default:
		l.mu.Lock()
		if time.Since(l.warned) > time.Minute {
			l.warned = time.Now()
			l.log.Warn("HTTP connections at their cap: new ones wait until one closes (a flood of connections, or raise the open-file limit)",
				"addr", l.Addr().String(), "max", cap(l.sem))
		}
		l.mu.Unlock()
		l.sem <- struct{}{}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.sem }}, nil
}

// limitedConn gives its slot back once, when closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
