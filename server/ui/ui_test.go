package ui

import (
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

func newHandler(t testing.TB, opts Config) *Handler {
	t.Helper()
	h, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func do(h http.Handler, method, path string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "http://beacon.test"+path, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestEveryPathUnderPrefixServesTheAppOrAnAsset(t *testing.T) {
	h := newHandler(t, Config{})
	for _, p := range []string{"/ui/", "/ui/services", "/ui/services/demo/web/http", "/ui/events", "/ui/no/such/page",
		"/ui/%3Cscript%3E", "/ui/..%2f..%2fetc%2fpasswd", "/ui/assets"} {
		w := do(h, http.MethodGet, p, nil)
		if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
			t.Errorf("GET %s = %d %s, want the application page", p, w.Code, w.Header().Get("Content-Type"))
		}
		if !strings.Contains(w.Body.String(), `<script type="module" src="/ui/assets/js/main.js">`) {
			t.Errorf("GET %s: body is not the application page", p)
		}
	}
	for p, ctype := range map[string]string{
		"/ui/assets/js/main.js":   "text/javascript; charset=utf-8",
		"/ui/assets/style.css":    "text/css; charset=utf-8",
		"/ui/assets/favicon.svg":  "image/svg+xml",
		"/ui/assets/js/stream.js": "text/javascript; charset=utf-8",
	} {
		w := do(h, http.MethodGet, p, nil)
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != ctype {
			t.Errorf("GET %s = %d %q, want 200 %q", p, w.Code, w.Header().Get("Content-Type"), ctype)
		}
	}
	for _, p := range []string{"/ui/assets/nope.js", "/ui/assets/../index.html", "/ui/assets/index.html", "/ui/assets/js/"} {
		if w := do(h, http.MethodGet, p, nil); w.Code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404 (an unknown asset is not the app)", p, w.Code)
		}
	}
}

func TestSecurityHeadersOnEveryResponse(t *testing.T) {
	h := newHandler(t, Config{})
	for _, p := range []string{"/ui/", "/ui/assets/js/main.js", "/ui/assets/nope.js", "/ui/x"} {
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			w := do(h, m, p, nil)
			csp := w.Header().Get("Content-Security-Policy")
			if csp != ContentSecurityPolicy || strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
				t.Errorf("%s %s: Content-Security-Policy %q", m, p, csp)
			}
			if w.Header().Get("X-Content-Type-Options") != "nosniff" || w.Header().Get("X-Frame-Options") != "DENY" {
				t.Errorf("%s %s: missing nosniff or frame denial: %v", m, p, w.Header())
			}
		}
	}
}

func TestOnlyReads(t *testing.T) {
	h := newHandler(t, Config{})
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		w := do(h, m, "/ui/services", nil)
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s = %d Allow %q, want 405 GET, HEAD", m, w.Code, w.Header().Get("Allow"))
		}
	}
	w := do(h, http.MethodHead, "/ui/assets/style.css", nil)
	if w.Code != http.StatusOK || w.Body.Len() != 0 || w.Header().Get("Content-Length") == "" {
		t.Errorf("HEAD = %d, %d body bytes, Content-Length %q", w.Code, w.Body.Len(), w.Header().Get("Content-Length"))
	}
}

func TestRevalidatesWithETagAndCompresses(t *testing.T) {
	h := newHandler(t, Config{})
	w := do(h, http.MethodGet, "/ui/assets/js/main.js", nil)
	etag := w.Header().Get("ETag")
	if etag == "" || w.Header().Get("Cache-Control") != "no-cache" {
		t.Fatalf("ETag %q Cache-Control %q", etag, w.Header().Get("Cache-Control"))
	}
	if w := do(h, http.MethodGet, "/ui/assets/js/main.js", map[string]string{"If-None-Match": etag}); w.Code != http.StatusNotModified || w.Body.Len() != 0 {
		t.Errorf("If-None-Match = %d with %d bytes, want 304 without a body", w.Code, w.Body.Len())
	}
	plain := w.Body.Bytes()
	gz := do(h, http.MethodGet, "/ui/assets/js/main.js", map[string]string{"Accept-Encoding": "br, gzip;q=0.8"})
	if gz.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("no gzip: %v", gz.Header())
	}
	zr, err := gzip.NewReader(gz.Body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(zr)
	if err != nil || !bytes.Equal(got, plain) {
		t.Errorf("gzip body differs from the plain one (%v)", err)
	}
	if w := do(h, http.MethodGet, "/ui/assets/js/main.js", map[string]string{"Accept-Encoding": "gzip;q=0"}); w.Header().Get("Content-Encoding") != "" {
		t.Errorf("gzip;q=0 still got %q", w.Header().Get("Content-Encoding"))
	}
}

func TestStreamSilenceReachesThePage(t *testing.T) {
	w := do(newHandler(t, Config{StreamSilence: 1500 * time.Millisecond}), http.MethodGet, "/ui/", nil)
	if !strings.Contains(w.Body.String(), `<meta name="beacon-stream-silence-ms" content="1500">`) {
		t.Errorf("page lacks the stream silence bound")
	}
	w = do(newHandler(t, Config{}), http.MethodGet, "/ui/", nil)
	if !strings.Contains(w.Body.String(), `content="45000"`) {
		t.Errorf("page lacks the default stream silence bound")
	}
	if _, err := New(Config{StreamSilence: -time.Second}); err == nil {
		t.Errorf("a negative StreamSilence was accepted")
	}
}

// TestAssetsNeverBuildHTMLFromData guards the rule that keeps instance
// names and metadata out of the HTML parser: no script of the dashboard
// uses an API that parses markup.
func TestAssetsNeverBuildHTMLFromData(t *testing.T) {
	forbidden := []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "createContextualFragment", "DOMParser", "srcdoc"}
	err := fs.WalkDir(embedded, assetsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".js") {
			return err
		}
		b, err := embedded.ReadFile(p)
		if err != nil {
			return err
		}
		for _, f := range forbidden {
			if bytes.Contains(b, []byte(f)) {
				t.Errorf("%s uses %s: build the DOM with textContent and DOM APIs only", p, f)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	index, err := embedded.ReadFile(assetsDir + "/index.html")
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAll(index, -1) {
		if !bytes.Contains(tag, []byte(" src=")) {
			t.Errorf("index.html has an inline script (%s), which the Content-Security-Policy forbids", tag)
		}
	}
	if m := regexp.MustCompile(`\son[a-z]+=`).Find(index); m != nil {
		t.Errorf("index.html has an inline event handler (%s)", m)
	}
}

func FuzzServePath(f *testing.F) {
	h := newHandler(f, Config{})
	for _, s := range []string{"/ui/", "/ui/assets/js/main.js", "/ui/assets/../../etc/passwd", "/ui/services/a/b/c/0123456789abcdef", "/ui/\x00", "/ui/assets/%2e%2e/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		r := httptest.NewRequest(http.MethodGet, "http://beacon.test/", nil)
		r.URL.Path = p
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		switch w.Code {
		case http.StatusOK, http.StatusNotFound, http.StatusFound:
		default:
			t.Fatalf("GET %q = %d", p, w.Code)
		}
		if w.Code == http.StatusOK && !strings.HasPrefix(p, Prefix) {
			t.Fatalf("GET %q served outside %s", p, Prefix)
		}
		if w.Header().Get("Content-Security-Policy") == "" {
			t.Fatalf("GET %q without a Content-Security-Policy", p)
		}
	})
}
