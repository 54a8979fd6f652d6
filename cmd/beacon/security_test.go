package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSecureServeEndToEnd runs the hardened configuration of
// docs/security.md: beacon serve with etcd auth (root from a file), mutual
// TLS on the etcd client port and HTTPS on the HTTP API; beacon auth
// grants a namespace to a role; a user with that role registers with
// `beacon register` (client TLS flags, credentials from the environment)
// and over HTTPS in its namespace only.
func TestSecureServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	srvLeaf, err := ca.Issue("server", testcerts.LeafOptions{CommonName: "beacon-server"})
	if err != nil {
		t.Fatal(err)
	}
	cliLeaf, err := ca.Issue("client", testcerts.LeafOptions{CommonName: "beacon-client", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(dir, "root-password")
	if err := os.WriteFile(pwFile, []byte("r00t-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
	client = strings.Replace(client, "http://", "https://", 1)
	httpAddr := strings.TrimPrefix(httpURL, "http://")
	serve := startBeacon(t, dir, nil, "serve", "--data-dir", "data", "--listen-client-urls", client, "--listen-peer-urls", peer,
		"--http-addr", httpAddr, "--auth", "--auth-root-password-file", pwFile, "--bcrypt-cost", "4",
		"--cert-file", srvLeaf.Cert, "--key-file", srvLeaf.Key, "--trusted-ca-file", ca.File, "--client-cert-auth",
		"--http-cert-file", srvLeaf.Cert, "--http-key-file", srvLeaf.Key, "--dns-addr=")
	serve.waitLine(t, "beacon serve is ready", 60*time.Second)
	serve.waitLine(t, "https://"+httpAddr, 10*time.Second)
	tlsFlags := []string{"--endpoints", client, "--cacert", ca.File, "--cert", cliLeaf.Cert, "--key", cliLeaf.Key}
	asRoot := []string{"ETCD_AUTH_USERNAME=root", "ETCD_AUTH_PASSWORD=r00t-secret"}

	grant := startBeacon(t, dir, asRoot, append([]string{"auth", "grant-namespace", "team-a-writer", "team-a"}, tlsFlags...)...)
	if err := grant.wait(t, 30*time.Second); err != nil {
		t.Fatalf("auth grant-namespace: %v\n%s", err, grant.errOut())
	}
	if !strings.Contains(grant.out(), "readwrite on /beacon-owners/team-a/") {
		t.Fatalf("auth grant-namespace output:\n%s", grant.out())
	}
	// Without root's password the same command fails, saying why.
	denied := startBeacon(t, dir, []string{"ETCD_AUTH_USERNAME=root", "ETCD_AUTH_PASSWORD=wrong"}, append([]string{"auth", "grant-namespace", "x", "team-x"}, tlsFlags...)...)
	if err := denied.wait(t, 30*time.Second); err == nil || !strings.Contains(denied.errOut(), "authenticate") {
		t.Fatalf("auth grant-namespace with a wrong password: %v\n%s", err, denied.errOut())
	}

	// alice gets the role (etcdctl user add / user grant-role).
	info := transport.TLSInfo{CertFile: cliLeaf.Cert, KeyFile: cliLeaf.Key, TrustedCAFile: ca.File}
	tlsCfg, err := info.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, TLS: tlsCfg, Username: "root", Password: "r00t-secret", DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := root.UserAdd(ctx, "alice", "alice-pw"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.UserGrantRole(ctx, "alice", "team-a-writer"); err != nil {
		t.Fatal(err)
	}
	asAlice := []string{"ETCD_AUTH_USERNAME=alice", "ETCD_AUTH_PASSWORD=alice-pw"}

	reg := startBeacon(t, dir, asAlice, append([]string{"register", "team-a/api/http", "--addr", "10.0.0.1:80"}, tlsFlags...)...)
	reg.waitLine(t, "registered team-a/api/http/", 30*time.Second)
	outside := startBeacon(t, dir, asAlice, append([]string{"register", "team-b/api/http", "--addr", "10.0.0.1:80"}, tlsFlags...)...)
	if err := outside.wait(t, 30*time.Second); err == nil || !strings.Contains(outside.errOut(), "permission denied") {
		t.Fatalf("register outside alice's namespace: %v\n%s", err, outside.errOut())
	}

	// The same rules over HTTPS.
	https := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlsCfg.RootCAs, MinVersion: tls.VersionTLS12}}}
	post := func(user, pw, ns string) (int, string) {
		req, _ := http.NewRequest("POST", "https://"+httpAddr+"/v1/registry/instances",
			strings.NewReader(`{"namespace":"`+ns+`","component":"api","endpoint":"http","address":"10.0.0.2:80"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":"+pw)))
		resp, err := https.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("alice", "alice-pw", "team-a"); code != http.StatusCreated {
		t.Fatalf("alice registers in team-a over HTTPS: %d %s", code, body)
	}
	if code, body := post("alice", "alice-pw", "team-b"); code != http.StatusForbidden || !strings.Contains(body, "grant-namespace") {
		t.Fatalf("alice registers in team-b over HTTPS: %d %s", code, body)
	}
	if code, body := post("alice", "wrong", "team-a"); code != http.StatusUnauthorized {
		t.Fatalf("wrong password over HTTPS: %d %s", code, body)
	}
	// Long after the banner: no warning for this loopback, TLS, auth setup.
	if strings.Contains(serve.out(), "WARNING") || strings.Contains(serve.errOut(), "SECURITY") {
		t.Fatalf("a loopback, TLS, auth configuration warns:\n%s\n%s", serve.out(), serve.errOut())
	}
}

// TestServeWarnsOffLoopback: a listener on every interface without TLS or
// auth is announced loudly.
func TestServeWarnsOffLoopback(t *testing.T) {
	client, peer, httpURL, dnsURL := freeURL(t), freeURL(t), freeURL(t), freeURL(t)
	_, port, _ := strings.Cut(strings.TrimPrefix(httpURL, "http://"), ":")
	_, dnsPort, _ := strings.Cut(strings.TrimPrefix(dnsURL, "http://"), ":")
	b := startBeacon(t, t.TempDir(), nil, "serve", "--data-dir", "data", "--listen-client-urls", client, "--listen-peer-urls", peer,
		"--http-addr", "0.0.0.0:"+port, "--dns-addr", "0.0.0.0:"+dnsPort)
	b.waitLine(t, "beacon serve is ready", 60*time.Second)
	b.waitLine(t, "--http-cert-file", 10*time.Second)                           // plain HTTP off loopback
	b.waitLine(t, "--auth", 10*time.Second)                                     // and no authentication
	b.waitLine(t, ":"+dnsPort+" answers anyone on the network", 10*time.Second) // DNS answers anyone
	waitStderr(t, b, "SECURITY", 10*time.Second)
}

// TestRootPasswordWithoutAuthWarns: BEACON_ROOT_PASSWORD without --auth
// (and etcd authentication off) was accepted without a word, although
// nothing uses it and every request is served unauthenticated.
func TestRootPasswordWithoutAuthWarns(t *testing.T) {
	httpAddr := strings.TrimPrefix(freeURL(t), "http://")
	b := startBeacon(t, t.TempDir(), []string{"BEACON_ROOT_PASSWORD=r00t-secret"}, "serve", "--backend", "memory",
		"--http-addr", httpAddr, "--dns-addr=")
	b.waitLine(t, "beacon serve is ready", 60*time.Second)
	waitStderr(t, b, "BEACON_ROOT_PASSWORD is set but --auth is not, and etcd authentication is off", 10*time.Second)
}

// TestProxyWarnsOffLoopback: beacon proxy on every interface without TLS
// is announced loudly; on loopback it is not.
func TestProxyWarnsOffLoopback(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	_, port, _ := strings.Cut(strings.TrimPrefix(freeURL(t), "http://"), ":")
	b := startBeacon(t, t.TempDir(), nil, "proxy", "--endpoints", srv.Endpoint(), "--listen-addr", "0.0.0.0:"+port)
	b.waitLine(t, "serving on", 30*time.Second)
	b.waitLine(t, ":"+port+" is plain text on a non-loopback address", 10*time.Second)
	if w := proxyExposureWarning(&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, false); w != "" {
		t.Errorf("loopback proxy warns: %s", w)
	}
	if w := proxyExposureWarning(&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1}, true); w != "" {
		t.Errorf("TLS proxy warns: %s", w)
	}
}
