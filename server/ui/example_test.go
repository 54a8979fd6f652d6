package ui_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/beaconplane/beacon/server/ui"
)

// Mount the dashboard on a mux of your own (beacon serve mounts it beside
// the registry API, whose watch the page follows).
func ExampleNew() {
	h, err := ui.New(ui.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+ui.Prefix, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, path := range []string{"/ui/", "/ui/services/demo/web/http", "/ui/assets/js/main.js", "/ui/assets/missing.js"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page := strings.Contains(string(body), `<script type="module" src="/ui/assets/js/main.js">`)
		fmt.Printf("%-28s %d %-24s page=%t csp=%t\n", path, resp.StatusCode, resp.Header.Get("Content-Type"), page,
			resp.Header.Get("Content-Security-Policy") == ui.ContentSecurityPolicy)
	}
	// Output:
	// /ui/                         200 text/html; charset=utf-8 page=true csp=true
	// /ui/services/demo/web/http   200 text/html; charset=utf-8 page=true csp=true
	// /ui/assets/js/main.js        200 text/javascript; charset=utf-8 page=false csp=true
	// /ui/assets/missing.js        404 application/json         page=false csp=true
}
