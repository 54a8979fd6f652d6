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

// queryRules returns, from the OpenAPI document, the query each documented
// operation takes, for the router (httpapi.Mux.Queries): it refuses any
// other parameter before the handler runs, so that a route added to the
// server and to openapi.json is strict without code of its own. Routes
// mounted as a prefix for their own protocol (v2 discovery) are not
// operations and keep their own parsing.
func queryRules() (func(pattern string) (httpapi.QueryRule, bool), error) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	type param struct {
		Name   string `json:"name"`
		In     string `json:"in"`
		Schema struct {
			Type string `json:"type"`
		} `json:"schema"`
	}
	rules := map[string]httpapi.QueryRule{}
	for path, item := range doc.Paths {
		var shared []param
		if raw, ok := item["parameters"]; ok {
			_ = json.Unmarshal(raw, &shared)
		}
		for method, raw := range item {
			if method == "parameters" {
				continue
			}
			var op struct {
				Parameters []param `json:"parameters"`
				// XQuery "open": the operation tolerates parameters it
				// does not take (a page, see httpapi.QueryRule.Open).
				XQuery string `json:"x-beacon-query"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				return nil, fmt.Errorf("openapi.json: %s %s: %w", method, path, err)
			}
			rule := httpapi.QueryRule{Params: []string{}, Open: op.XQuery == "open"}
			for _, p := range append(shared, op.Parameters...) {
				if p.In != "query" {
					continue
				}
				rule.Params = append(rule.Params, p.Name)
				if p.Schema.Type == "array" {
					rule.Repeatable = append(rule.Repeatable, p.Name)
				}
			}
			rules[strings.ToUpper(method)+" "+path] = rule
		}
	}
	return func(pattern string) (httpapi.QueryRule, bool) {
		method, path, ok := strings.Cut(pattern, " ")
		if !ok {
			return httpapi.QueryRule{}, false // a prefix mount, for its own protocol
		}
		// {name...} wildcards and an exact-match {$} ("GET /{$}" is the
		// document's "/") are written as OpenAPI paths.
		rule, ok := rules[method+" "+strings.ReplaceAll(strings.TrimSuffix(path, "{$}"), "...}", "}")]
		return rule, ok
	}, nil
}
