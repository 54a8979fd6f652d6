package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testcerts"
)

func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
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
				_, _ = c.Write([]byte("x"))
			}()
		}
	}()
	return ln.Addr().String()
}

func pool(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(b)
	return p
}

func serial(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestReloaderRotatesAndKeepsAWorkingPair: a new pair is served once the
// files change; a pair that does not load (a certificate without its key)
// leaves the previous one in use.
func TestReloaderRotatesAndKeepsAWorkingPair(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("srv", testcerts.LeafOptions{Server: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReloader(Files{CertFile: leaf.Cert, KeyFile: leaf.Key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	client := &tls.Config{RootCAs: pool(t, ca.File), MinVersion: tls.VersionTLS12}
	first := serial(t, addr, client)

	// A broken pair: the key file of another certificate.
	other, err := ca.Issue("other", testcerts.LeafOptions{Server: true})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(other.Key)
	if err := os.WriteFile(leaf.Key, key, 0o600); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.checked = time.Time{}
	r.mu.Unlock()
	if got := serial(t, addr, client); got != first {
		t.Fatalf("a mismatched pair replaced the working one: serial %s, was %s", got, first)
	}
	// A good pair again.
	if _, err := ca.Issue("srv", testcerts.LeafOptions{Server: true}); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.checked = time.Time{}
	r.mu.Unlock()
	if got := serial(t, addr, client); got == first {
		t.Fatal("the rotated certificate is not served")
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		f    Files
		want string
	}{
		{Files{CertFile: "x"}, "give both"},
		{Files{ClientCertAuth: true}, "needs --http-trusted-ca-file"},
		{Files{TrustedCAFile: "/nonexistent"}, "without --http-cert-file"},
		{Files{CertFile: "/nonexistent/c", KeyFile: "/nonexistent/k"}, "no such file"},
	} {
		err := c.f.Validate("http-")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.f, err, c.want)
		}
	}
	if err := (Files{}).Validate(""); err != nil {
		t.Errorf("no files: %v", err)
	}
}
