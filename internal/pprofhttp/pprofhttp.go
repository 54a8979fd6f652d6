// Package pprofhttp serves Go's runtime profiles (net/http/pprof) on a
// mux, under /debug/pprof/, as etcd's --enable-pprof does: `beacon serve
// --pprof` and `beacon proxy --pprof` turn it on (off by default).
package pprofhttp

import (
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"
)

// Prefix is where the profiles are served.
const Prefix = "/debug/pprof/"

// Router is where Mount adds the handlers (an *http.ServeMux, or the
// server's JSON-answering mux).
type Router interface {
	HandleFunc(pattern string, handler func(http.ResponseWriter, *http.Request))
}

// Mount adds the profile handlers to mux: the index at Prefix, the named
// profiles (heap, goroutine, allocs, block, mutex, threadcreate) under it,
// and cmdline, profile (CPU, ?seconds=N), symbol and trace.
func Mount(mux Router) {
	mux.HandleFunc(Prefix, pprof.Index)
	mux.HandleFunc(Prefix+"cmdline", pprof.Cmdline)
	mux.HandleFunc(Prefix+"profile", pprof.Profile)
	mux.HandleFunc(Prefix+"symbol", pprof.Symbol)
	mux.HandleFunc(Prefix+"trace", pprof.Trace)
}

// Hold is how long a profile request holds its connection before it
// answers, as net/http/pprof reads its seconds parameter: a CPU profile
// 30 s unless told (?seconds=N), a trace 1 s, a named profile with
// ?seconds=N (a delta) that long; 0 for anything else. A server that
// bounds each request's time must allow this much more, or the profile is
// cut (an empty reply) — `go tool pprof` asks for 30 s by default.
func Hold(r *http.Request) time.Duration {
	if !strings.HasPrefix(r.URL.Path, Prefix) {
		return 0
	}
	q := r.URL.Query().Get("seconds")
	switch strings.TrimPrefix(r.URL.Path, Prefix) {
	case "profile":
		if n, err := strconv.ParseInt(q, 10, 64); err == nil && n > 0 {
			return time.Duration(min(n, maxHold)) * time.Second
		}
		return 30 * time.Second
	case "trace":
		if f, err := strconv.ParseFloat(q, 64); err == nil && f > 0 {
			return time.Duration(min(f, maxHold) * float64(time.Second))
		}
		return time.Second
	}
	if n, err := strconv.ParseInt(q, 10, 64); err == nil && n > 0 {
		return time.Duration(min(n, maxHold)) * time.Second
	}
	return 0
}

// maxHold bounds Hold (seconds): a longer profile is cut.
const maxHold = 3600
