// Package pprofhttp serves Go's runtime profiles (net/http/pprof) on a
// mux, under /debug/pprof/, as etcd's --enable-pprof does: `beacon serve
// --pprof` and `beacon proxy --pprof` turn it on (off by default).
package pprofhttp

import (
	"net/http"
	"net/http/pprof"
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
