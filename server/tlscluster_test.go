package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestTLSClusterThroughDiscoveryToken bootstraps three `beacon serve`
// members through a v3 discovery token held by a fourth, everything over
// mutual TLS: the discovery client, the members' peer links and their
// client listeners; and with etcd authentication, which the members enable
// concurrently. The cluster forms, replicates, and serves its HTTP API as
// the authenticated user on every member; a late node serves as a TLS
// proxy of the full cluster.
func TestTLSClusterThroughDiscoveryToken(t *testing.T) {
	p := newPKI(t)
	files := TLSFiles{CertFile: p.server.Cert, KeyFile: p.server.Key, TrustedCAFile: p.ca.File, ClientCertAuth: true}
	secure := func(cfg Config) Config {
		for i, u := range cfg.ListenClientURLs {
			cfg.ListenClientURLs[i] = strings.Replace(u, "http://", "https://", 1)
		}
		for i, u := range cfg.ListenPeerURLs {
			cfg.ListenPeerURLs[i] = strings.Replace(u, "http://", "https://", 1)
		}
		cfg.Security.ClientTLS, cfg.Security.PeerTLS = files, files
		return cfg
	}
	registry := startServer(t, secure(testConfig(t)))
	created := createToken(t, registry, 3)
	var cfgs []Config
	for _, name := range []string{"t1", "t2", "t3"} {
		cfg := secure(discoveryConfig(t, name, created))
		cfg.Discovery.CertFile, cfg.Discovery.KeyFile, cfg.Discovery.CACertFile = p.client.Cert, p.client.Key, p.ca.File
		cfg.Security.Auth, cfg.Security.RootPassword, cfg.Security.BcryptCost = true, rootPassword, 4
		cfgs = append(cfgs, cfg)
	}
	servers := startServers(t, cfgs...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	info := transport.TLSInfo{CertFile: p.client.Cert, KeyFile: p.client.Key, TrustedCAFile: p.ca.File}
	tlsCfg, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, s := range servers {
		all = append(all, s.Endpoints().ClientURLs...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: all, TLS: tlsCfg, Username: "root", Password: rootPassword, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ml, err := cli.MemberList(ctx)
	if err != nil || len(ml.Members) != 3 {
		t.Fatalf("members: %v, %v", ml, err)
	}
	for _, m := range ml.Members {
		for _, u := range append(m.PeerURLs, m.ClientURLs...) {
			if !strings.HasPrefix(u, "https://") {
				t.Fatalf("member %s advertises %s: want https", m.Name, u)
			}
		}
	}
	if _, err := cli.Put(ctx, "/services/hello", "cluster"); err != nil {
		t.Fatal(err)
	}
	// Auth is on on every member: each HTTP API acts as the request's
	// user and refuses requests without credentials.
	for i, s := range servers {
		code, body := get(t, s.Endpoints().HTTP+"/readyz")
		if code != 200 {
			t.Fatalf("member %d /readyz: %d %s", i, code, body)
		}
		r := as{t: t, base: s.Endpoints().HTTP, auth: basic("root", rootPassword)}.do("GET", "/v1/registry/instances", "")
		if r.code != 200 {
			t.Fatalf("member %d HTTP API as root: %d %s", i, r.code, r.body)
		}
		if r := (as{t: t, base: s.Endpoints().HTTP}).do("GET", "/v1/registry/instances", ""); r.code != 401 {
			t.Fatalf("member %d HTTP API without credentials: %d %s", i, r.code, r.body)
		}
	}
	kv, err := servers[2].Store().Get(ctx, "/services/hello")
	if err != nil || string(kv.Value) != "cluster" {
		t.Fatalf("read on the third member: %q, %v", kv.Value, err)
	}

	// A late node falls back to a proxy of the full cluster: it serves
	// TLS where its members' clients would connect, reaches the members
	// over TLS, and its HTTP API still requires credentials.
	late := secure(discoveryConfig(t, "t4", created))
	late.Discovery.CertFile, late.Discovery.KeyFile, late.Discovery.CACertFile = p.client.Cert, p.client.Key, p.ca.File
	late.Discovery.Fallback = FallbackProxy
	late.Security.Auth, late.Security.RootPassword = true, rootPassword
	px := startServer(t, late)
	pcli, err := clientv3.New(clientv3.Config{Endpoints: late.ListenClientURLs, TLS: tlsCfg, Username: "root", Password: rootPassword, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("TLS client of the fallback proxy: %v", err)
	}
	defer pcli.Close()
	if got, err := pcli.Get(ctx, "/services/hello"); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("read through the fallback proxy: %v, %v", got, err)
	}
	if code, body := get(t, px.Endpoints().HTTP+"/readyz"); code != 200 {
		t.Fatalf("fallback /readyz: %d %s", code, body)
	}
	if r := (as{t: t, base: px.Endpoints().HTTP}).do("GET", "/v1/registry/instances", ""); r.code != 401 {
		t.Fatalf("fallback HTTP API without credentials: %d %s", r.code, r.body)
	}
	if r := (as{t: t, base: px.Endpoints().HTTP, auth: basic("root", rootPassword)}).do("GET", "/v1/registry/instances", ""); r.code != 200 {
		t.Fatalf("fallback HTTP API as root: %d %s", r.code, r.body)
	}
}
