package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// waitLog waits until the log holds want.
func waitLog(t *testing.T, logs *syncbuf.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not log %q; log:\n%s", want, logs.String())
		}
		pollPause()
	}
}

// waitLogLine waits until one line of the log holds every string of want.
func waitLogLine(t *testing.T, logs *syncbuf.Buffer, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, line := range strings.Split(logs.String(), "\n") {
			all := true
			for _, w := range want {
				all = all && strings.Contains(line, w)
			}
			if all {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server logged no line with %q; log:\n%s", want, logs.String())
		}
		pollPause()
	}
}

// pollPause is one step of a loop that waits, with a deadline, for
// something the server does on its own schedule (a log line, a reload).
func pollPause() {
	t := time.NewTimer(25 * time.Millisecond)
	defer t.Stop()
	<-t.C
}

// pki is the TLS material of a test: the server's CA, another CA that
// signed nothing of the server's, and certificates from both.
type pki struct {
	ca, other *testcerts.CA
	server    testcerts.Leaf // 127.0.0.1, ::1, localhost
	client    testcerts.Leaf // CN root, from ca
	stranger  testcerts.Leaf // CN root, from other
	expired   testcerts.Leaf // CN root, from ca, expired
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	var p pki
	var err error
	must := func(e error) {
		t.Helper()
		if e != nil {
			t.Fatal(e)
		}
	}
	p.ca, err = testcerts.NewCA(dir, "ca")
	must(err)
	p.other, err = testcerts.NewCA(dir, "other-ca")
	must(err)
	p.server, err = p.ca.Issue("server", testcerts.LeafOptions{CommonName: "beacon-server"})
	must(err)
	p.client, err = p.ca.Issue("client", testcerts.LeafOptions{CommonName: "root", Client: true})
	must(err)
	p.stranger, err = p.other.Issue("stranger", testcerts.LeafOptions{CommonName: "root", Client: true})
	must(err)
	p.expired, err = p.ca.Issue("expired", testcerts.LeafOptions{CommonName: "root", Client: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	must(err)
	return p
}

// tlsClient returns a client TLS configuration trusting caFile, presenting
// leaf (if set), expecting serverName (if set).
func tlsClient(t *testing.T, caFile string, leaf *testcerts.Leaf, serverName string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if leaf != nil {
		cert, err := tls.LoadX509KeyPair(leaf.Cert, leaf.Key)
		if err != nil {
			t.Fatal(err)
		}
		// Sent whatever CAs the server asks for, as a misconfigured or
		// hostile client would (Go's client otherwise sends none).
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	}
	return c
}

func httpsClient(cfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

// tlsConfig is testConfig with TLS (and client-certificate authentication)
// on the etcd client and peer listeners and HTTPS on the HTTP API, logging
// to logs.
func tlsConfig(t *testing.T, p pki, logs io.Writer) Config {
	cfg := testConfig(t)
	for i, u := range cfg.ListenClientURLs {
		cfg.ListenClientURLs[i] = strings.Replace(u, "http://", "https://", 1)
	}
	for i, u := range cfg.ListenPeerURLs {
		cfg.ListenPeerURLs[i] = strings.Replace(u, "http://", "https://", 1)
	}
	files := TLSFiles{CertFile: p.server.Cert, KeyFile: p.server.Key, TrustedCAFile: p.ca.File, ClientCertAuth: true}
	cfg.Security.ClientTLS, cfg.Security.PeerTLS = files, files
	cfg.Security.HTTPTLS = TLSFiles{CertFile: p.server.Cert, KeyFile: p.server.Key, TrustedCAFile: p.ca.File}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	lvl := zapcore.WarnLevel
	cfg.EtcdLogLevel = &lvl
	return cfg
}

// handshake connects to addr with cfg and returns the handshake's error
// (TLS 1.3 reports a refused client certificate on the first read).
func handshake(addr string, cfg *tls.Config) error {
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	if err != nil && !strings.Contains(err.Error(), "timeout") {
		return err
	}
	return nil
}

// etcdGet reads one key through an etcd client with tlsCfg; it returns the
// error of the first call.
func etcdGet(t *testing.T, endpoint string, tlsCfg *tls.Config) error {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = cli.Get(ctx, "/k")
	return err
}

// serialOf returns the serial number of the certificate addr serves.
func serialOf(t *testing.T, addr string, cfg *tls.Config) *big.Int {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

// TestTLSListeners checks the embedded etcd's client listener and the
// HTTP API over TLS and mutual TLS, with every way TLS goes wrong: a
// client that does not trust the server's CA, a client certificate from
// another CA, an expired one, a server name the certificate does not
// cover, plain text to a TLS port. Each fails with a clear error on the
// client side and a log line on the server side.
func TestTLSListeners(t *testing.T) {
	p := newPKI(t)
	logs := &syncbuf.Buffer{}
	s := startServer(t, tlsConfig(t, p, logs))
	ep := s.Endpoints()
	if !strings.HasPrefix(ep.HTTP, "https://") || !strings.HasPrefix(ep.ClientURLs[0], "https://") || !strings.HasPrefix(ep.PeerURLs[0], "https://") {
		t.Fatalf("endpoints %+v: want https everywhere", ep)
	}
	etcdURL := ep.ClientURLs[0]
	etcdAddr := strings.TrimPrefix(etcdURL, "https://")
	httpAddr := strings.TrimPrefix(ep.HTTP, "https://")

	t.Run("etcd client listener", func(t *testing.T) {
		if err := etcdGet(t, etcdURL, tlsClient(t, p.ca.File, &p.client, "")); err != nil {
			t.Fatalf("mutual TLS with the right certificates: %v", err)
		}
		for _, c := range []struct {
			name       string
			cfg        *tls.Config
			client     string // in the client's error
			serverLogs string // in the server's log ("" to skip)
		}{
			{"untrusted server CA", tlsClient(t, p.other.File, &p.client, ""), "certificate signed by unknown authority", "bad certificate"},
			{"client certificate from another CA", tlsClient(t, p.ca.File, &p.stranger, ""), "tls:", "unknown authority"},
			{"expired client certificate", tlsClient(t, p.ca.File, &p.expired, ""), "tls:", "expired"},
			{"no client certificate", tlsClient(t, p.ca.File, nil, ""), "tls:", "didn't provide a certificate"},
			{"wrong server name", tlsClient(t, p.ca.File, &p.client, "etcd.example.com"), "not etcd.example.com", ""},
		} {
			err := handshake(etcdAddr, c.cfg)
			if err == nil {
				t.Errorf("%s: the TLS connection was accepted", c.name)
				continue
			}
			if !strings.Contains(err.Error(), c.client) {
				t.Errorf("%s: client error %q does not say %q", c.name, err, c.client)
			}
			if c.serverLogs != "" {
				waitLogLine(t, logs, "rejected connection on client endpoint", c.serverLogs)
			}
		}
		// Beacon's etcd store names the problem instead of timing out.
		if err := etcdGet(t, etcdURL, tlsClient(t, p.other.File, &p.client, "")); err == nil {
			t.Error("an etcd client that does not trust the server's CA got an httpAnswer")
		}
		// Plain text to the TLS port.
		resp, err := http.Get("http://" + etcdAddr + "/version")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS") {
				t.Errorf("plain HTTP to etcd's TLS port: %d %s", resp.StatusCode, b)
			}
		}
		if err := etcdGet(t, "http://"+etcdAddr, nil); err == nil {
			t.Error("plain gRPC to etcd's TLS port succeeded")
		}
	})

	t.Run("etcd peer listener", func(t *testing.T) {
		peerAddr := strings.TrimPrefix(ep.PeerURLs[0], "https://")
		if err := handshake(peerAddr, tlsClient(t, p.ca.File, &p.client, "")); err != nil {
			t.Fatalf("mutual TLS to the peer port with the right certificates: %v", err)
		}
		for _, c := range []struct {
			name, client, serverLogs string
			cfg                      *tls.Config
		}{
			{"untrusted server CA", "certificate signed by unknown authority", "", tlsClient(t, p.other.File, &p.client, "")},
			{"peer certificate from another CA", "tls:", "unknown authority", tlsClient(t, p.ca.File, &p.stranger, "")},
			{"expired peer certificate", "tls:", "expired", tlsClient(t, p.ca.File, &p.expired, "")},
			{"no peer certificate", "tls:", "didn't provide a certificate", tlsClient(t, p.ca.File, nil, "")},
			{"wrong server name", "not peer.example.com", "", tlsClient(t, p.ca.File, &p.client, "peer.example.com")},
		} {
			err := handshake(peerAddr, c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.client) {
				t.Errorf("%s: %v, want an error saying %q", c.name, err, c.client)
			}
			if c.serverLogs != "" {
				waitLogLine(t, logs, "rejected connection on peer endpoint", c.serverLogs)
			}
		}
		resp, err := http.Get("http://" + peerAddr + "/members")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("plain HTTP to the TLS peer port: %d %s", resp.StatusCode, b)
			}
		}
	})

	t.Run("HTTP API", func(t *testing.T) {
		good := httpsClient(tlsClient(t, p.ca.File, nil, ""))
		resp, err := good.Get(ep.HTTP + "/healthz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("HTTPS without a client certificate (optional): %v %v", resp, err)
		}
		resp.Body.Close()
		resp, err = httpsClient(tlsClient(t, p.ca.File, &p.client, "")).Get(ep.HTTP + "/healthz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("HTTPS with a client certificate: %v %v", resp, err)
		}
		resp.Body.Close()
		for _, c := range []struct {
			name       string
			cfg        *tls.Config
			client     string
			serverLogs string
		}{
			{"untrusted server CA", tlsClient(t, p.other.File, nil, ""), "certificate signed by unknown authority", "TLS handshake error"},
			{"client certificate from another CA", tlsClient(t, p.ca.File, &p.stranger, ""), "tls:", "unknown authority"},
			{"expired client certificate", tlsClient(t, p.ca.File, &p.expired, ""), "tls:", "expired"},
			{"wrong server name", tlsClient(t, p.ca.File, nil, "api.example.com"), "not api.example.com", ""},
		} {
			resp, err := httpsClient(c.cfg).Get(ep.HTTP + "/healthz")
			if err == nil {
				resp.Body.Close()
				t.Errorf("%s: the request succeeded", c.name)
				continue
			}
			if c.client != "" && !strings.Contains(err.Error(), c.client) {
				t.Errorf("%s: client error %q does not say %q", c.name, err, c.client)
			}
			if c.serverLogs != "" {
				waitLog(t, logs, c.serverLogs)
			}
		}
		resp, err = http.Get("http://" + httpAddr + "/healthz")
		if err != nil {
			t.Fatalf("plain HTTP to the HTTPS port: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS") {
			t.Errorf("plain HTTP to the HTTPS port: %d %s", resp.StatusCode, b)
		}
		waitLog(t, logs, "client sent an HTTP request to an HTTPS server")
	})

	t.Run("rotation", func(t *testing.T) {
		cfg := tlsClient(t, p.ca.File, &p.client, "")
		before := map[string]*big.Int{"http": serialOf(t, httpAddr, cfg), "etcd": serialOf(t, etcdAddr, cfg)}
		if _, err := p.ca.Issue("server", testcerts.LeafOptions{CommonName: "beacon-server"}); err != nil {
			t.Fatal(err)
		}
		for name, addr := range map[string]string{"http": httpAddr, "etcd": etcdAddr} {
			deadline := time.Now().Add(10 * time.Second)
			for serialOf(t, addr, cfg).Cmp(before[name]) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%s listener still serves certificate %v after rotation", name, before[name])
				}
				pollPause()
			}
		}
		// A new CA for client certificates: the HTTP API reloads the
		// CA bundle too (etcd loads it once).
		ca2, err := testcerts.NewCA(t.TempDir(), "ca2")
		if err != nil {
			t.Fatal(err)
		}
		c2, err := ca2.Issue("client2", testcerts.LeafOptions{CommonName: "root", Client: true})
		if err != nil {
			t.Fatal(err)
		}
		newClient := httpsClient(tlsClient(t, p.ca.File, &c2, ""))
		if resp, err := newClient.Get(ep.HTTP + "/healthz"); err == nil {
			resp.Body.Close()
			t.Fatal("a client certificate of a CA not yet trusted was accepted")
		}
		bundle, err := os.ReadFile(ca2.File)
		if err != nil {
			t.Fatal(err)
		}
		old, err := os.ReadFile(p.ca.File)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p.ca.File+".tmp", append(old, bundle...), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p.ca.File+".tmp", p.ca.File); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := newClient.Get(ep.HTTP + "/healthz")
			if err == nil {
				resp.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the HTTP API does not accept the new CA's client certificate after the bundle changed: %v", err)
			}
			pollPause()
		}
		waitLog(t, logs, "TLS files changed")
	})
}

// TestExpiredCertificatesRefusedAtStart: an expired certificate on any
// listener is an error of the configuration naming the flag and the file
// (etcd would serve it, and every client would refuse it); one not valid
// yet is a warning.
func TestExpiredCertificatesRefusedAtStart(t *testing.T) {
	p := newPKI(t)
	expired := TLSFiles{CertFile: p.expired.Cert, KeyFile: p.expired.Key}
	for flag, set := range map[string]func(*Security){
		"Config.Security.ClientTLS.CertFile": func(s *Security) { s.ClientTLS = expired },
		"Config.Security.PeerTLS.CertFile":   func(s *Security) { s.PeerTLS = expired },
		"Config.Security.HTTPTLS.CertFile":   func(s *Security) { s.HTTPTLS = expired },
	} {
		cfg := tlsConfig(t, p, io.Discard)
		set(&cfg.Security)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), flag+": certificate "+p.expired.Cert+" expired at") {
			t.Errorf("%s expired: %v, want an error naming the flag and the file", flag, err)
		}
	}
	early, err := p.ca.Issue("early", testcerts.LeafOptions{NotBefore: time.Now().Add(time.Hour), NotAfter: time.Now().Add(48 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := tlsConfig(t, p, io.Discard)
	cfg.Security.PeerTLS.CertFile, cfg.Security.PeerTLS.KeyFile = early.Cert, early.Key
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a certificate not valid yet: %v, want only a warning", err)
	}
	s := &Server{cfg: cfg}
	s.initSecurity()
	if w := strings.Join(s.securityWarnings(), "\n"); !strings.Contains(w, "Config.Security.PeerTLS.CertFile: certificate "+early.Cert+" is not valid until") {
		t.Fatalf("warnings %q: want one for the certificate not valid yet", w)
	}
}

// TestHTTPSRotationKeepsTheListenersNames: a certificate rotated in
// without the names clients reach the HTTP API by (its address, localhost)
// was loaded silently, after which every client failed to verify it. Now
// the listener keeps the previous certificate, logs an error naming what
// is missing, and /metrics shows beacon_tls_reloads_total{outcome=
// "refused_names"} and beacon_tls_files_refused 1; a fixed certificate is
// then taken.
func TestHTTPSRotationKeepsTheListenersNames(t *testing.T) {
	p := newPKI(t)
	logs := &syncbuf.Buffer{}
	leaf, err := p.ca.Issue("api", testcerts.LeafOptions{Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	cfg.Security.HTTPTLS = TLSFiles{CertFile: leaf.Cert, KeyFile: leaf.Key}
	s := startServer(t, cfg)
	base := s.Endpoints().HTTP
	addr := strings.TrimPrefix(base, "https://")
	client := tlsClient(t, p.ca.File, nil, "")
	first := serialOf(t, addr, client)
	// Each new connection is a handshake, at which the files are checked.
	getOK := func() string {
		t.Helper()
		resp, err := httpsClient(client).Get(base + "/metrics")
		if err != nil {
			t.Fatalf("an HTTPS client of the API: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if _, err := p.ca.Issue("api", testcerts.LeafOptions{Server: true, Hosts: []string{"elsewhere.example"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "the new certificate does not cover names clients reach this listener by") {
		getOK()
		if time.Now().After(deadline) {
			t.Fatalf("no error for a rotated certificate without the listener's names; log:\n%s", logs.String())
		}
		pollPause()
	}
	metrics := getOK()
	if got := serialOf(t, addr, client); got.Cmp(first) != 0 {
		t.Fatalf("the listener serves the certificate without its names (serial %v, was %v)", got, first)
	}
	waitLogLine(t, logs, "level=ERROR", "127.0.0.1", "elsewhere.example")
	for _, want := range []string{`beacon_tls_reloads_total{listener="http",outcome="refused_names"} 1`, `beacon_tls_files_refused{listener="http"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(metrics, "beacon_tls_"))
		}
	}
	if _, err := p.ca.Issue("api", testcerts.LeafOptions{Server: true}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for serialOf(t, addr, client).Cmp(first) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the fixed certificate is not served")
		}
		pollPause()
	}
	if m := getOK(); !strings.Contains(m, `beacon_tls_files_refused{listener="http"} 0`) {
		t.Errorf("/metrics after the fix:\n%s", grepLines(m, "beacon_tls_"))
	}
}
