package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readyTimeout bounds the store round trip of /readyz.
const readyTimeout = 2 * time.Second

// startHTTP builds the routes and serves them on the listener taken in
// Start.
func (s *Server) startHTTP() {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.gather, promhttp.HandlerOpts{ErrorLog: slogErrorLog{s}}))
	s.mountAPIs(mux)

	ctx, cancel := context.WithCancel(context.Background())
	s.stopHTTP = cancel
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          nil,
	}
	s.mu.Lock()
	s.httpSrv = srv
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(s.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.fail(err)
		}
	}()
}

// mountAPIs adds the capability APIs (registry, bootstrap tokens, v2
// discovery) that need the store.
func (s *Server) mountAPIs(mux *http.ServeMux) {}

type readiness struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

// readyz reports ready when embedded etcd (if any) serves and a read of
// the store succeeds.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	res := readiness{Status: "ok", Checks: map[string]string{}}
	if s.etcd != nil {
		select {
		case <-s.etcd.Server.ReadyNotify():
			res.Checks["etcd"] = "ok"
		default:
			res.Checks["etcd"] = "not ready"
			res.Status = "unavailable"
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if _, _, err := s.store.List(ctx, "/beacon-readyz-probe/"); err != nil {
		res.Checks["store"] = err.Error()
		res.Status = "unavailable"
	} else {
		res.Checks["store"] = "ok"
	}
	code := http.StatusOK
	if res.Status != "ok" {
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(res)
}

// slogErrorLog adapts the server logger for promhttp.
type slogErrorLog struct{ s *Server }

func (l slogErrorLog) Println(v ...any) { l.s.log.Error("metrics", "err", v) }
