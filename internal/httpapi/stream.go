package httpapi

import (
	"bufio"
	"net"
	"net/http"
	"time"
)

// StreamChunk is the most one write deadline of a stream covers.
const StreamChunk = 64 << 10

// writeInPieces writes p with write in pieces of at most StreamChunk, each
// under a deadline of its own (set), limit from when it starts: a client
// that stops reading fails the write within limit of its last progress,
// while one that reads slowly but steadily never does, however large p.
func writeInPieces(p []byte, limit time.Duration, set func(time.Time) error, write func([]byte) (int, error)) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), StreamChunk)
		_ = set(time.Now().Add(limit))
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
// client that stopped reading. A connection its handler takes over (a
// websocket upgrade) keeps the deadlines: see Hijack. Unwrap gives the
// ResponseWriter beneath to http.ResponseController.
type StreamWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	limit time.Duration
}

// NewStreamWriter wraps w; limit is how long one piece may take.
func NewStreamWriter(w http.ResponseWriter, limit time.Duration) *StreamWriter {
	return &StreamWriter{w: w, rc: http.NewResponseController(w), limit: limit}
}

// Header implements http.ResponseWriter.
func (s *StreamWriter) Header() http.Header { return s.w.Header() }

// WriteHeader implements http.ResponseWriter.
func (s *StreamWriter) WriteHeader(code int) { s.w.WriteHeader(code) }

// Write writes p in pieces, each under its own deadline.
func (s *StreamWriter) Write(p []byte) (int, error) {
	return writeInPieces(p, s.limit, s.rc.SetWriteDeadline, s.w.Write)
}

// FlushError sends what is buffered to the client, under a deadline.
func (s *StreamWriter) FlushError() error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.limit))
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
	return writeInPieces(p, c.limit, c.SetWriteDeadline, c.Conn.Write)
}
