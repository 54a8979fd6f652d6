package httpapi

import (
	"net/http"
	"time"
)

// StreamChunk is the most one write deadline of a StreamWriter covers.
const StreamChunk = 64 << 10

// StreamWriter is the http.ResponseWriter of a response that streams (a
// watch): every write and flush to the client gets a deadline of its own,
// limit from when it starts, and a large write goes in pieces of at most
// StreamChunk, each with a fresh one. A client that stops reading is
// dropped within limit of its last progress, its handler's writes failing,
// so that no write blocks forever on it; one that reads slowly but steadily
// is not, however large a write. Unwrap gives the ResponseWriter beneath
// to http.ResponseController.
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
	n := 0
	for len(p) > 0 {
		c := min(len(p), StreamChunk)
		_ = s.rc.SetWriteDeadline(time.Now().Add(s.limit))
		m, err := s.w.Write(p[:c])
		n += m
		if err != nil {
			return n, err
		}
		p = p[c:]
	}
	return n, nil
}

// FlushError sends what is buffered to the client, under a deadline.
func (s *StreamWriter) FlushError() error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.limit))
	return s.rc.Flush()
}

// Flush implements http.Flusher (for handlers that flush through it, such
// as grpc-gateway's); FlushError reports the error.
func (s *StreamWriter) Flush() { _ = s.FlushError() }

// Unwrap returns the ResponseWriter beneath.
func (s *StreamWriter) Unwrap() http.ResponseWriter { return s.w }
