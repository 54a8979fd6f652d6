package server

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// CORS lets a browser page served from another origin use the HTTP API
// (the SSE watch, the registry and token APIs) when its origin is listed
// in Config.CORSAllowedOrigins; it is off when the list is empty (the
// default): browsers then refuse such pages the responses, as the
// same-origin policy wants.

// corsAllowHeaders are the request headers a page may send: JSON bodies,
// SSE resumption and credentials for the API.
const corsAllowHeaders = "Content-Type, Last-Event-ID, Authorization, Beacon-Secret"

// validateCORS checks the allowed origins: "*", or scheme://host[:port].
func validateCORS(origins []string) []error {
	var errs []error
	for _, o := range origins {
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			errs = append(errs, fmt.Errorf("Config.CORSAllowedOrigins %q: want * or an origin such as https://dashboard.example.com (scheme, host, optional port; no path)", o))
		}
	}
	return errs
}

// cors wraps h with CORS for the allowed origins (h itself when none).
func cors(origins []string, h http.Handler) http.Handler {
	if len(origins) == 0 {
		return h
	}
	any := slices.Contains(origins, "*")
	allowed := map[string]bool{}
	for _, o := range origins {
		allowed[strings.TrimSuffix(strings.ToLower(o), "/")] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		hdr := w.Header()
		hdr.Add("Vary", "Origin")
		if origin == "" || (!any && !allowed[strings.ToLower(origin)]) {
			h.ServeHTTP(w, r)
			return
		}
		if any {
			hdr.Set("Access-Control-Allow-Origin", "*")
		} else {
			hdr.Set("Access-Control-Allow-Origin", origin)
		}
		hdr.Set("Access-Control-Expose-Headers", "Allow, X-Etcd-Index, Retry-After, WWW-Authenticate")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			// A preflight: say what the page may send, for ten minutes.
			hdr.Add("Vary", "Access-Control-Request-Method")
			hdr.Add("Vary", "Access-Control-Request-Headers")
			hdr.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, PUT, PATCH, DELETE")
			hdr.Set("Access-Control-Allow-Headers", corsAllowHeaders)
			hdr.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.ServeHTTP(w, r)
	})
}
