package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/server/registryapi"
)

// BenchmarkAuthenticatedList measures what authentication costs a request
// of the HTTP API: GET /v1/registry/instances?namespace=bench (10
// instances) on a server without auth, and on one with auth as a Basic
// user and with a Bearer token (both served by the user's cached view:
// etcd checks the token on every call, bcrypt only on the first). Compare
// the auth runs' ns/op with the open run's: the ratio is the overhead.
func BenchmarkAuthenticatedList(b *testing.B) {
	for _, mode := range []string{"open", "basic", "bearer"} {
		b.Run(mode, func(b *testing.B) { benchList(b, mode) })
	}
}

func benchList(b *testing.B, mode string) {
	url := func() string {
		p, err := etcdtest.FreePort()
		if err != nil {
			b.Fatal(err)
		}
		return fmt.Sprintf("http://127.0.0.1:%d", p)
	}
	cfg := Config{DataDir: b.TempDir(), HTTPAddr: "127.0.0.1:0", ListenClientURLs: []string{url()}, ListenPeerURLs: []string{url()}}
	if mode != "open" {
		cfg.Security.Auth, cfg.Security.RootPassword, cfg.Security.BcryptCost = true, rootPassword, 4
	}
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	base := s.Endpoints().HTTP
	auth := ""
	switch mode {
	case "basic":
		auth = basic("root", rootPassword)
	case "bearer":
		req, _ := http.NewRequest("POST", base+TokenPath, nil)
		req.Header.Set("Authorization", basic("root", rootPassword))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var tok TokenResponse
		err = json.NewDecoder(resp.Body).Decode(&tok)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		auth = "Bearer " + tok.Token
	}
	do := func(method, path, body string) int {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, base+path, rd)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 10 {
		if code := do("POST", registryapi.InstancesPath, `{"namespace":"bench","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"1h"}`); code != 201 {
			b.Fatalf("register: %d", code)
		}
	}
	for b.Loop() {
		if code := do("GET", registryapi.InstancesPath+"?namespace=bench", ""); code != 200 {
			b.Fatalf("list: %d", code)
		}
	}
}
