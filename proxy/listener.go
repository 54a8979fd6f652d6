package proxy

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// http2Preface starts every HTTP/2 connection with prior knowledge, which
// is how gRPC clients talk over cleartext.
var http2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

// sniffTimeout bounds how long a new connection may take to send its
// first bytes.
const sniffTimeout = 10 * time.Second

// splitListener accepts connections on one listener and hands each to the
// gRPC server (HTTP/2 preface) or the HTTP server (anything else), so both
// share one port while gRPC keeps its native transport.
type splitListener struct {
	root      net.Listener
	grpc, web *chanListener
	log       *slog.Logger
	maxConns  string // names Config.MaxConns in the log (SettingName)
	wg        sync.WaitGroup
	warned    time.Time // when an accept error was last logged (serve's)
}

func newSplitListener(l net.Listener, log *slog.Logger, maxConns string) *splitListener {
	done := make(chan struct{})
	var once sync.Once
	closeAll := func() { once.Do(func() { close(done) }) }
	return &splitListener{
		root:     l,
		grpc:     &chanListener{addr: l.Addr(), ch: make(chan net.Conn), done: done, close: closeAll},
		web:      &chanListener{addr: l.Addr(), ch: make(chan net.Conn), done: done, close: closeAll},
		log:      log,
		maxConns: maxConns,
	}
}

// serve accepts until the root listener is closed. An accept that fails
// for want of resources (file descriptors, kernel memory) or because a
// client gave up on its connection is tried again after a pause growing
// from 5 ms to 1 s, as net/http's server does: before, the first such
// error closed the listener, and the proxy, alive, took no connection
// again.
func (s *splitListener) serve() error {
	defer s.wg.Wait()
	var pause time.Duration
	for {
		c, err := s.root.Accept()
		if err != nil && retryableAccept(err) {
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			s.warnAccept(err, pause)
			select {
			case <-time.After(pause):
				continue
			case <-s.grpc.done:
				err = net.ErrClosed
			}
		}
		if err != nil {
			s.grpc.close()
			return err
		}
		pause = 0
		s.wg.Go(func() { s.route(c) })
	}
}

// retryableAccept reports whether an accept failed for a passing reason:
// the process or the system out of file descriptors, the kernel out of
// memory, a connection reset before it was accepted.
func retryableAccept(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.ECONNRESET} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// warnAccept logs a failed accept, at most once a minute.
func (s *splitListener) warnAccept(err error, pause time.Duration) {
	if time.Since(s.warned) < time.Minute {
		return
	}
	s.warned = time.Now()
	s.log.Warn("accepting a client connection failed; trying again (out of file descriptors: raise the open-file limit, or lower the connection bound)",
		"err", err, "pause", pause, "bound", s.maxConns)
}

func (s *splitListener) route(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	buf := make([]byte, len(http2Preface))
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if !bytes.Equal(buf[:n], http2Preface[:n]) {
			break
		}
		if err != nil {
			if n == 0 || !errors.Is(err, io.EOF) {
				_ = c.Close()
				return
			}
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	pc := &peekedConn{Conn: c, peeked: buf[:n]}
	target := s.web
	if bytes.Equal(buf[:n], http2Preface) {
		target = s.grpc
	}
	select {
	case target.ch <- pc:
	case <-target.done:
		_ = c.Close()
	}
}

// close stops accepting.
func (s *splitListener) close() error {
	s.grpc.close()
	return s.root.Close()
}

// chanListener is a net.Listener fed by splitListener.
type chanListener struct {
	addr  net.Addr
	ch    chan net.Conn
	done  chan struct{}
	close func()
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.close()
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// peekedConn replays the sniffed bytes before reading on.
type peekedConn struct {
	net.Conn
	peeked []byte
}

func (c *peekedConn) Read(b []byte) (int, error) {
	if len(c.peeked) > 0 {
		n := copy(b, c.peeked)
		c.peeked = c.peeked[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// NetConn returns the connection it reads from (connlimit finds its own
// connection under it).
func (c *peekedConn) NetConn() net.Conn { return c.Conn }
