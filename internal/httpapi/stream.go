package httpapi

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// StreamChunk is the most one write deadline of a stream covers.
const StreamChunk = 64 << 10

// writeInPieces writes p with write in pieces of at most StreamChunk, each
// under a deadline of its own (set before it, a limit from when it
// starts): a client that stops reading fails the write within that limit
// of its last progress, while one that reads slowly but steadily never
// does, however large p.
func writeInPieces(p []byte, set func() error, write func([]byte) (int, error)) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), StreamChunk)
		_ = set()
		m, err := write(p[:c])
		n += m
		if err != nil {
			return n, err
		}
		p = p[c:]
	}
	return n, nil
}

// StreamWriter is the http.ResponseWriter of a response that streams (a
// watch): every write (in pieces, see writeInPieces) and flush to the
// client gets a deadline of its own, so that no write blocks forever on a
// client that stopped reading. Once the request's context is done (the
// server shuts down, or the client went) no write may take longer than
// EndGrace from then, not even one already waiting: a stream says why it
// ends, and never holds up a shutdown for a client that does not read. A
// connection its handler takes over (a websocket upgrade) keeps the
// per-piece deadlines: see Hijack. Unwrap gives the ResponseWriter beneath
// to http.ResponseController. Release it when the handler returns.
type StreamWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	limit time.Duration
	stop  func() bool // stops the context's AfterFunc

	// mu orders the deadlines set for each write and the one set when
	// the context ends, so that a write never gets one past endBy.
	mu    sync.Mutex
	endBy time.Time // zero until the context is done
}

// EndGrace is how long a stream's writes may still take once its
// request's context is done: time to tell a reading client why its stream
// ends, not enough to hold up a shutdown.
const EndGrace = time.Second

// NewStreamWriter wraps w, the response to a request whose context is
// ctx; limit is how long one piece may take.
func NewStreamWriter(ctx context.Context, w http.ResponseWriter, limit time.Duration) *StreamWriter {
	s := &StreamWriter{w: w, rc: http.NewResponseController(w), limit: limit}
	s.stop = context.AfterFunc(ctx, s.end)
	return s
}

// Release stops watching the request's context; call it before the
// handler returns (the response may not be touched after).
func (s *StreamWriter) Release() {
	s.stop()
	s.mu.Lock() // an end already running finishes first
	defer s.mu.Unlock()
}

// end bounds every write from now, the one waiting included, by EndGrace.
func (s *StreamWriter) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endBy = time.Now().Add(EndGrace)
	_ = s.rc.SetWriteDeadline(s.endBy)
}

// setDeadline gives the next write limit, or what is left of EndGrace.
func (s *StreamWriter) setDeadline() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := time.Now().Add(s.limit)
	if !s.endBy.IsZero() && s.endBy.Before(d) {
		d = s.endBy
	}
	return s.rc.SetWriteDeadline(d)
}

// Header implements http.ResponseWriter.
func (s *StreamWriter) Header() http.Header { return s.w.Header() }

// WriteHeader implements http.ResponseWriter.
func (s *StreamWriter) WriteHeader(code int) { s.w.WriteHeader(code) }

// Write writes p in pieces, each under its own deadline.
func (s *StreamWriter) Write(p []byte) (int, error) {
	return writeInPieces(p, s.setDeadline, s.w.Write)
}

// FlushError sends what is buffered to the client, under a deadline.
func (s *StreamWriter) FlushError() error {
	_ = s.setDeadline()
	return s.rc.Flush()
}

// Flush implements http.Flusher (for handlers that flush through it, such
// as grpc-gateway's); FlushError reports the error.
func (s *StreamWriter) Flush() { _ = s.FlushError() }

// Hijack implements http.Hijacker: the connection it returns writes in
// pieces under deadlines as the StreamWriter does (reads are untouched).
func (s *StreamWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := s.rc.Hijack()
	if err != nil {
		return nil, nil, err
	}
	return streamConn{Conn: c, limit: s.limit}, brw, nil
}

// Unwrap returns the ResponseWriter beneath.
func (s *StreamWriter) Unwrap() http.ResponseWriter { return s.w }

// streamConn is a hijacked connection whose writes go in pieces under
// deadlines.
type streamConn struct {
	net.Conn
	limit time.Duration
}

func (c streamConn) Write(p []byte) (int, error) {
	return writeInPieces(p, func() error { return c.SetWriteDeadline(time.Now().Add(c.limit)) }, c.Conn.Write)
}
