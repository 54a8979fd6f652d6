package server

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/beaconplane/beacon/internal/httpapi"
)

// openAPI is the OpenAPI document of every route Beacon's HTTP listener
// may serve. /v1/openapi.json serves it with only the operations the
// running server serves (the token API needs etcd, for one); the test
// TestOpenAPIMatchesServedRoutes keeps the two in step.
//
//go:embed openapi.json
var openAPI []byte

// httpMethods are the operations of an OpenAPI path item.
var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// servedOpenAPI returns the document restricted to what mux serves.
func servedOpenAPI(mux *httpapi.Mux) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	paths, _ := doc["paths"].(map[string]any)
	for path, item := range paths {
		ops, _ := item.(map[string]any)
		kept := 0
		for _, m := range httpMethods {
			if _, ok := ops[m]; !ok {
				continue
			}
			if mux.Serves(strings.ToUpper(m), path) {
				kept++
			} else {
				delete(ops, m)
			}
		}
		if kept == 0 {
			delete(paths, path)
		}
	}
	return json.Marshal(doc)
}

// openAPIHandler serves servedOpenAPI, computed at the first request
// (every route is registered by then).
func openAPIHandler(mux *httpapi.Mux) http.Handler {
	var (
		once sync.Once
		doc  []byte
		err  error
	)
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		once.Do(func() { doc, err = servedOpenAPI(mux) })
		if err != nil {
			httpapi.WriteError(w, http.StatusInternalServerError, httpapi.CodeInternal, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(doc)
	})
}
