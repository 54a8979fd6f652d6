package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/internal/pprofhttp"
	"github.com/beaconplane/beacon/server/registryapi"
)

// maxHeaderBytes bounds a request's header (net/http's default is 1 MiB).
const maxHeaderBytes = 64 << 10

// configureHTTPServer sets the limits of the HTTP listener: header size
// and time, idle connections, and the error log (TLS handshake failures
// such as plain HTTP sent to the HTTPS port are logged there).
func (s *Server) configureHTTPServer(srv *http.Server) {
	srv.MaxHeaderBytes = maxHeaderBytes
	srv.IdleTimeout = s.sec.IdleTimeout
	srv.ErrorLog = slog.NewLogLogger(s.log.With("component", "http").Handler(), slog.LevelWarn)
	// ReadTimeout and WriteTimeout stay zero: guard sets per-request
	// deadlines that watch streams can extend (a server-wide write
	// timeout would cut every stream).
}

// guard wraps the whole HTTP listener: the Host check, the body limit and
// the per-request deadlines. (Authentication wraps the full routes, inside
// CORS, so that a browser can read a 401: startHTTP.)
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.hostAllowed(r.Host) {
			writeErr(w, http.StatusMisdirectedRequest, "misdirected_request",
				"Host "+quoteHost(r.Host)+" is not a name of this server: add it with "+s.cfg.setting("Config.Security.HostWhitelist")+" (the check defeats DNS rebinding; IP addresses and localhost always work)")
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, s.sec.MaxBodyBytes)
		}
		rc := http.NewResponseController(w)
		d := s.requestDeadline(r)
		if d >= 0 {
			// What the request waits for (the store: a lock held by a
			// stopped process, a cluster without a leader) ends with its
			// deadline too: socket deadlines alone left the handler
			// waiting, its answer unsent, and a registration applied
			// long after its client had given up (its secret never
			// received, the instance advertised for its whole TTL).
			ctx, cancel := context.WithTimeoutCause(r.Context(), d, fmt.Errorf("the request took longer than %v (%s)", d, s.cfg.setting("Config.Security.RequestTimeout")))
			defer cancel()
			r = r.WithContext(ctx)
		}
		switch {
		case d < 0: // a stream: it manages its own deadlines
		case d > s.sec.RequestTimeout:
			// A long poll (a GET, no body to wait for): the read deadline
			// is the write deadline, since net/http cancels the request's
			// context when a read deadline passes, which would end the
			// poll at the request timeout.
			_ = rc.SetReadDeadline(time.Now().Add(d))
			_ = rc.SetWriteDeadline(time.Now().Add(d))
		default:
			// The answer may be written a moment after the body stopped
			// arriving, so that a client too slow to send it is told so
			// (408) rather than cut off without a word.
			now := time.Now()
			_ = rc.SetReadDeadline(now.Add(d))
			_ = rc.SetWriteDeadline(now.Add(d + answerGrace))
		}
		next.ServeHTTP(w, r)
	})
}

// answerGrace is how long after its read deadline a request may still be
// answered.
const answerGrace = 2 * time.Second

// requestDeadline is how long r may take to answer, or -1 for a stream.
func (s *Server) requestDeadline(r *http.Request) time.Duration {
	switch {
	case r.URL.Path == registryapi.WatchPath:
		return -1
	case v2Waits(r):
		// A v2 wait is held up to the service's wait timeout.
		return v2.DefaultWaitTimeout + s.sec.RequestTimeout
	case s.cfg.EnablePprof && r.Method == http.MethodGet:
		if hold := pprofhttp.Hold(r); hold > 0 {
			return hold + s.sec.RequestTimeout
		}
	}
	return s.sec.RequestTimeout
}

func quoteHost(h string) string {
	if h == "" {
		return `""`
	}
	return `"` + h + `"`
}

// allowedHosts computes the Host names the HTTP API answers to.
func (s *Server) allowedHosts() map[string]bool {
	hosts := map[string]bool{"localhost": true}
	for _, h := range s.sec.HostWhitelist {
		hosts[strings.ToLower(strings.TrimSuffix(h, "."))] = true
	}
	add := func(raw string) {
		if u, err := url.Parse(raw); err == nil && u.Host != "" {
			hosts[strings.ToLower(u.Hostname())] = true
		}
	}
	if host, _, err := net.SplitHostPort(s.cfg.HTTPAddr); err == nil && host != "" {
		hosts[strings.ToLower(host)] = true
	}
	add(s.cfg.V2BaseURL)
	for _, u := range s.cfg.AdvertiseClientURLs {
		add(u)
	}
	return hosts
}

// hostAllowed checks a request's Host header: IP addresses (a DNS
// rebinding attack needs a name), the loopback names, the server's own
// names and --host-whitelist pass; "*" lets everything pass.
func (s *Server) hostAllowed(hostport string) bool {
	if hostport == "" || s.hosts["*"] {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if net.ParseIP(host) != nil {
		return true
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	return s.hosts[host]
}

// etcdHostWhitelist is the embedded etcd's --host-whitelist, which etcd
// checks on plain-HTTP requests to its JSON gateway (/v3/kv/..., reachable
// from a browser page through DNS rebinding): the server's names and the
// listen and advertised hosts. etcd matches exact names, not "any IP
// address", so without --host-whitelist it is set only when every client
// listener is on loopback (clients then name a loopback address or
// localhost); nil means etcd's default, allow all.
func (s *Server) etcdHostWhitelist() map[string]struct{} {
	if s.hosts["*"] {
		return nil
	}
	if len(s.sec.HostWhitelist) == 0 {
		for _, raw := range s.cfg.ListenClientURLs {
			if u, err := url.Parse(raw); err != nil || !isLoopback(u.Hostname()) {
				return nil
			}
		}
	}
	out := map[string]struct{}{"127.0.0.1": {}, "::1": {}}
	for h := range s.hosts {
		out[h] = struct{}{}
	}
	for _, raw := range s.cfg.ListenClientURLs {
		if u, err := url.Parse(raw); err == nil && u.Hostname() != "" {
			out[u.Hostname()] = struct{}{}
		}
	}
	return out
}
