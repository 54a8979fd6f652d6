package server

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
)

// TestCORS: off by default (no Access-Control headers, OPTIONS is a 405);
// with allowed origins, a page of such an origin may preflight and use
// the API, the SSE watch included, and other origins get no CORS headers.
func TestCORS(t *testing.T) {
	do := func(base, method, path, origin string, hdr map[string]string) *http.Response {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, method, base+path, nil)
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	preflight := map[string]string{"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "last-event-id"}

	off := startServer(t, Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}})
	base := off.Endpoints().HTTP
	if r := do(base, "GET", "/v1/registry/instances", "https://app.example", nil); r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("CORS is on by default: %v", r.Header)
	}
	if r := do(base, "OPTIONS", "/v1/registry/watch", "https://app.example", preflight); r.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("preflight without CORS: %d", r.StatusCode)
	}

	if err := (Config{CORSAllowedOrigins: []string{"app.example"}}).Validate(); err == nil || !strings.Contains(err.Error(), "Config.CORSAllowedOrigins") {
		t.Errorf("an origin without scheme: %v", err)
	}
	on := startServer(t, Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory},
		CORSAllowedOrigins: []string{"https://app.example"}})
	base = on.Endpoints().HTTP
	r := do(base, "OPTIONS", "/v1/registry/watch", "https://app.example", preflight)
	if r.StatusCode != http.StatusNoContent || r.Header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(r.Header.Get("Access-Control-Allow-Headers"), "Last-Event-ID") ||
		!strings.Contains(r.Header.Get("Access-Control-Allow-Methods"), "GET") {
		t.Errorf("preflight: %d %v", r.StatusCode, r.Header)
	}
	r = do(base, "GET", "/v1/registry/watch?namespace=prod", "https://app.example", nil)
	if r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != "https://app.example" || !strings.Contains(r.Header.Get("Vary"), "Origin") {
		t.Errorf("SSE watch from an allowed origin: %d %v", r.StatusCode, r.Header)
	}
	if line, err := bufio.NewReader(r.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "retry:") {
		t.Errorf("SSE stream: %q %v", line, err)
	}
	if r := do(base, "GET", "/v1/registry/instances", "https://evil.example", nil); r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("another origin got CORS headers: %v", r.Header)
	}
}
