package ui

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon/internal/httpapi"
)

// Prefix is where the dashboard is served. Every path under it that is not
// an asset answers with the application (client-side routing).
const Prefix = "/ui/"

// assetsDir is the folder of assets inside the embedded file system; its
// files are served under Prefix + "assets/".
const assetsDir = "assets"

// DefaultStreamSilence is how long the dashboard waits without a byte on
// its event stream (events or keep-alive comments) before it drops the
// connection and reconnects: three of the registry API's default 15 s
// keep-alive intervals.
const DefaultStreamSilence = 45 * time.Second

// ContentSecurityPolicy is sent with every response under Prefix: scripts,
// styles and connections only from the serving origin, no inline script or
// style, no plugins, no framing.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

//go:embed assets
var embedded embed.FS

// Config configures the dashboard. The zero value is usable.
type Config struct {
	// StreamSilence is how long the page's watch stream may stay silent
	// before the page reconnects (resuming with Last-Event-ID). It must
	// exceed the registry API's keep-alive interval; DefaultStreamSilence
	// when zero.
	StreamSilence time.Duration
}

// Handler serves the dashboard's assets and, for every other path under
// Prefix, the application page. Create it with New.
type Handler struct {
	files map[string]*asset // by path under Prefix, e.g. "assets/js/main.js"
	index *asset
}

type asset struct {
	body  []byte
	gz    []byte // nil when compression does not pay
	ctype string
	etag  string
}

// New returns the dashboard handler. Mount it at Prefix.
func New(cfg Config) (*Handler, error) {
	if cfg.StreamSilence == 0 {
		cfg.StreamSilence = DefaultStreamSilence
	}
	if cfg.StreamSilence < 0 {
		return nil, fmt.Errorf("ui: StreamSilence %v: must be positive", cfg.StreamSilence)
	}
	h := &Handler{files: map[string]*asset{}}
	err := fs.WalkDir(embedded, assetsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := embedded.ReadFile(p)
		if err != nil {
			return err
		}
		if p == assetsDir+"/index.html" {
			body = bytes.Replace(body, []byte("{{stream-silence-ms}}"),
				[]byte(html.EscapeString(strconv.FormatInt(cfg.StreamSilence.Milliseconds(), 10))), 1)
			h.index = newAsset(p, body)
			return nil
		}
		h.files[p] = newAsset(p, body)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ui: read embedded assets: %w", err)
	}
	if h.index == nil {
		return nil, fmt.Errorf("ui: embedded assets lack index.html")
	}
	return h, nil
}

func newAsset(name string, body []byte) *asset {
	a := &asset{body: body, ctype: contentType(name)}
	sum := sha256.Sum256(body)
	a.etag = `"` + hex.EncodeToString(sum[:12]) + `"`
	if len(body) > 1024 && compressible(a.ctype) {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		_, _ = zw.Write(body)
		_ = zw.Close()
		if b.Len() < len(body)*9/10 {
			a.gz = b.Bytes()
		}
	}
	return a
}

func contentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	case ".json", ".webmanifest":
		return "application/json"
	}
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}

func compressible(ctype string) bool {
	return strings.HasPrefix(ctype, "text/") || ctype == "image/svg+xml" || ctype == "application/json"
}

// ServeHTTP serves GET and HEAD: an asset under Prefix+"assets/", 404 for
// an unknown asset, and the application page for every other path.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cross-Origin-Opener-Policy", "same-origin")
	hdr.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		httpapi.WriteError(w, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed,
			fmt.Sprintf("%s is not allowed on the dashboard: it is read with GET", r.Method))
		return
	}
	rel, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		http.Redirect(w, r, Prefix, http.StatusFound)
		return
	}
	a := h.index
	if strings.HasPrefix(rel, assetsDir+"/") {
		if a = h.files[rel]; a == nil {
			httpapi.WriteError(w, http.StatusNotFound, httpapi.CodeNotFound, "no such dashboard asset: "+rel)
			return
		}
	}
	a.serve(w, r)
}

func (a *asset) serve(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Type", a.ctype)
	// Revalidate every time: the ETag makes that a 304 without a body,
	// and an upgraded server never serves a stale script.
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("ETag", a.etag)
	if a.gz != nil {
		hdr.Add("Vary", "Accept-Encoding")
	}
	if etagMatch(r.Header.Get("If-None-Match"), a.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body := a.body
	if a.gz != nil && acceptsGzip(r.Header.Get("Accept-Encoding")) {
		body = a.gz
		hdr.Set("Content-Encoding", "gzip")
	}
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

func etagMatch(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || strings.TrimPrefix(t, "W/") == etag {
			return true
		}
	}
	return false
}

func acceptsGzip(header string) bool {
	for _, part := range strings.Split(header, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			q := strings.TrimSpace(params)
			return q == "" || (q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000")
		}
	}
	return false
}
