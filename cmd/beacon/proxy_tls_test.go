package main

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"math/big"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"github.com/beaconplane/beacon/internal/tlsfiles"
	"github.com/beaconplane/beacon/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestProxyTLSRotationKeepsTheListenAddress: `beacon proxy`'s client
// listener refuses a rotated certificate that does not cover its listen
// address (every client reaching it there would fail to verify it): the
// previous certificate stays, the refusal is logged at error level and
// counted on the proxy's /metrics registry.
func TestProxyTLSRotationKeepsTheListenAddress(t *testing.T) {
	ca, err := testcerts.NewCA(t.TempDir(), "ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("proxy", testcerts.LeafOptions{Server: true})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	reg := prometheus.NewRegistry()
	cfg := proxy.Config{ListenAddr: "127.0.0.1:0", Registry: reg}
	lt := &proxyListenTLS{files: tlsfiles.Files{CertFile: leaf.Cert, KeyFile: leaf.Key}}
	if err := lt.apply(&cfg, slog.New(slog.NewTextHandler(logs, nil))); err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg.ServerTLS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	client := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	serialOf := func() *big.Int {
		t.Helper()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String(), client)
		if err != nil {
			t.Fatalf("a client of the proxy's listener: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	first := serialOf()
	if _, err := ca.Issue("proxy", testcerts.LeafOptions{Server: true, Hosts: []string{"elsewhere.example"}}); err != nil {
		t.Fatal(err)
	}
	// The files are checked at a handshake, at most once a second.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "level=ERROR") {
		if got := serialOf(); got.Cmp(first) != 0 {
			t.Fatalf("the proxy serves a certificate without its listen address (serial %v, was %v)", got, first)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no error for a certificate without the listen address; log:\n%s", logs.String())
		}
		tick := time.NewTimer(50 * time.Millisecond)
		<-tick.C
	}
	if !strings.Contains(logs.String(), "does not cover names") || !strings.Contains(logs.String(), "127.0.0.1") {
		t.Fatalf("the error does not say what is missing:\n%s", logs.String())
	}
	if n, err := testutil.GatherAndCount(reg, "beacon_tls_reloads_total"); err != nil || n != 1 {
		t.Fatalf("beacon_tls_reloads_total series: %d, %v", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP beacon_tls_files_refused 1 while a listener's TLS files on disk are refused and the previous ones stay in use (see beacon_tls_reloads_total and the log).
# TYPE beacon_tls_files_refused gauge
beacon_tls_files_refused{listener="proxy"} 1
`), "beacon_tls_files_refused"); err != nil {
		t.Fatal(err)
	}
}
