package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"github.com/prometheus/client_golang/prometheus"
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
	r, err := NewReloader(Files{CertFile: leaf.Cert, KeyFile: leaf.Key}, Config{})
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

// flagName names the fields as a command's --http-* flags would.
func flagName(field string) string {
	return map[string]string{"CertFile": "--http-cert-file", "KeyFile": "--http-key-file",
		"TrustedCAFile": "--http-trusted-ca-file", "ClientCertAuth": "--http-client-cert-auth"}[field]
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
		err := c.f.Validate(flagName)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.f, err, c.want)
		}
	}
	if err := (Files{}).Validate(flagName); err != nil {
		t.Errorf("no files: %v", err)
	}
}

// textLogger logs into b as text.
func textLogger(b *syncbuf.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// recheck lets the next call look at the files again, at now.
func recheck(r *Reloader, now time.Time) {
	r.mu.Lock()
	r.checked = time.Time{}
	r.now = func() time.Time { return now }
	r.mu.Unlock()
}

// TestReloaderRefusesCertificatesOutOfDate: an expired certificate is an
// error at start; one not valid yet a warning. Rotated to an expired or
// not-yet-valid certificate, the reloader keeps the valid one in use and
// warns once; it takes the new one once it becomes valid. Expired
// certificates in a CA bundle are warned about.
func TestReloaderRefusesCertificatesOutOfDate(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	expired := testcerts.LeafOptions{Server: true, NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)}
	future := testcerts.LeafOptions{Server: true, NotBefore: now.Add(time.Hour), NotAfter: now.Add(48 * time.Hour)}

	old, err := ca.Issue("old", expired)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewReloader(Files{CertFile: old.Cert, KeyFile: old.Key}, Config{}); err == nil ||
		!strings.Contains(err.Error(), "certificate "+old.Cert+" expired at") || !strings.Contains(err.Error(), "renew it") {
		t.Fatalf("an expired certificate at start: %v, want an error naming the file", err)
	}
	if _, err := CheckCertificate(old.Cert, old.Key, now); err == nil || !strings.Contains(err.Error(), "expired at") {
		t.Fatalf("CheckCertificate of an expired certificate: %v", err)
	}
	early, err := ca.Issue("early", future)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	if _, err := NewReloader(Files{CertFile: early.Cert, KeyFile: early.Key}, Config{Logger: textLogger(&logs)}); err != nil ||
		!strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "is not valid until") {
		t.Fatalf("a certificate not valid yet at start: %v, log %q; want a warning", err, logs.String())
	}
	if warn, err := CheckCertificate(early.Cert, early.Key, now); err != nil || !strings.Contains(warn, "is not valid until") {
		t.Fatalf("CheckCertificate of a certificate not valid yet: %q, %v", warn, err)
	}

	// A server on a valid certificate, rotated to an expired one.
	leaf, err := ca.Issue("srv", testcerts.LeafOptions{Server: true})
	if err != nil {
		t.Fatal(err)
	}
	logs = syncbuf.Buffer{}
	r, err := NewReloader(Files{CertFile: leaf.Cert, KeyFile: leaf.Key}, Config{Logger: textLogger(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	client := &tls.Config{RootCAs: pool(t, ca.File), MinVersion: tls.VersionTLS12}
	first := serial(t, addr, client)
	if _, err := ca.Issue("srv", expired); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		recheck(r, time.Now())
		if got := serial(t, addr, client); got != first {
			t.Fatalf("rotated to an expired certificate: serving serial %s, was %s", got, first)
		}
	}
	if n := strings.Count(logs.String(), "outside its validity period; keeping the previous certificate"); n != 1 {
		t.Fatalf("%d warnings for one expired certificate, want 1:\n%s", n, logs.String())
	}
	// Rotated to one valid from an hour on: kept out until then.
	if _, err := ca.Issue("srv", future); err != nil {
		t.Fatal(err)
	}
	recheck(r, time.Now())
	if got := serial(t, addr, client); got != first {
		t.Fatalf("rotated to a certificate not valid yet: serving serial %s, was %s", got, first)
	}
	if n := strings.Count(logs.String(), "outside its validity period; keeping the previous certificate"); n != 2 {
		t.Fatalf("the certificate not valid yet was not warned about:\n%s", logs.String())
	}
	recheck(r, now.Add(2*time.Hour))
	if got := r.Certificate(); got == nil || got.Leaf.SerialNumber.String() == first || !got.Leaf.NotBefore.Equal(future.NotBefore.Truncate(time.Second)) {
		t.Fatalf("the new certificate is not used once valid: %+v", got.Leaf)
	}

	// A CA bundle with an expired CA: loaded, with a warning.
	oldCA, err := testcerts.NewCA(dir, "old-ca")
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle.pem")
	a, _ := os.ReadFile(ca.File)
	b, _ := os.ReadFile(oldCA.File)
	if err := os.WriteFile(bundle, append(a, b...), 0o600); err != nil {
		t.Fatal(err)
	}
	logs = syncbuf.Buffer{}
	r, err = NewReloader(Files{CertFile: leaf.Cert, KeyFile: leaf.Key, TrustedCAFile: bundle}, Config{Logger: textLogger(&logs)})
	if err != nil || strings.Contains(logs.String(), "expired") {
		t.Fatalf("a valid bundle: %v %s", err, logs.String())
	}
	recheck(r, now.Add(30*24*time.Hour)) // both CAs expired by then
	if err := os.WriteFile(bundle, append(b, a...), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = r.Pool()
	if !strings.Contains(logs.String(), "the CA bundle holds expired certificates") || !strings.Contains(logs.String(), "CN=old-ca") {
		t.Fatalf("no warning for expired CAs in the bundle:\n%s", logs.String())
	}
}

// TestReloaderRefusesCertificateWithoutTheListenersNames: a certificate
// rotated in that no longer covers a name or address clients reach the
// listener by was loaded silently, after which every client failed to
// verify it. Now it is refused while the one in use is valid: the previous
// certificate stays, an error is logged (once per version of the files),
// beacon_tls_reloads_total{outcome="refused_names"} counts it and
// beacon_tls_files_refused is 1; a fixed certificate is then taken. Without
// names, a certificate that shares none with the one in use is refused the
// same way. If the one in use has expired, the new one is taken, loudly.
func TestReloaderRefusesCertificateWithoutTheListenersNames(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		names []string
	}{
		{"the listener's names", ListenerNames("127.0.0.1:9379", "localhost")},
		{"no names: the previous certificate's", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			leaf, err := ca.Issue("srv-"+strings.ReplaceAll(c.name, " ", "-"), testcerts.LeafOptions{Server: true, Hosts: []string{"127.0.0.1", "localhost"}})
			if err != nil {
				t.Fatal(err)
			}
			var logs syncbuf.Buffer
			reg := prometheus.NewPedanticRegistry()
			r, err := NewReloader(Files{CertFile: leaf.Cert, KeyFile: leaf.Key}, Config{Logger: textLogger(&logs), Listener: "http", Names: c.names, Metrics: reg})
			if err != nil {
				t.Fatal(err)
			}
			addr := serve(t, r.ServerConfig())
			client := &tls.Config{RootCAs: pool(t, ca.File), MinVersion: tls.VersionTLS12, ServerName: "localhost"}
			first := serial(t, addr, client)
			base := strings.TrimSuffix(filepath.Base(leaf.Cert), ".pem")
			// Rotated to a certificate for another host only.
			if _, err := ca.Issue(base, testcerts.LeafOptions{Server: true, Hosts: []string{"other.example"}}); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				recheck(r, time.Now())
				if got := serial(t, addr, client); got != first {
					t.Fatalf("a certificate without the listener's names was loaded (serial %s, was %s)", got, first)
				}
			}
			if n := strings.Count(logs.String(), "level=ERROR msg=\"TLS files changed but the new certificate does not cover names"); n != 1 {
				t.Fatalf("%d error lines for one refused certificate, want 1:\n%s", n, logs.String())
			}
			if !strings.Contains(logs.String(), "localhost") || !strings.Contains(logs.String(), "other.example") {
				t.Fatalf("the error does not name what is missing and what the new certificate has:\n%s", logs.String())
			}
			if got := metricValue(t, reg, "beacon_tls_reloads_total", "refused_names"); got != 1 {
				t.Fatalf("refused_names = %v, want 1", got)
			}
			if got := metricValue(t, reg, "beacon_tls_files_refused", ""); got != 1 {
				t.Fatalf("beacon_tls_files_refused = %v, want 1", got)
			}
			// A fixed certificate (the names, and one more) is taken.
			if _, err := ca.Issue(base, testcerts.LeafOptions{Server: true, Hosts: []string{"127.0.0.1", "localhost", "new.example"}}); err != nil {
				t.Fatal(err)
			}
			recheck(r, time.Now())
			if got := serial(t, addr, client); got == first {
				t.Fatal("the fixed certificate is not served")
			}
			if metricValue(t, reg, "beacon_tls_reloads_total", "loaded") != 1 || metricValue(t, reg, "beacon_tls_files_refused", "") != 0 {
				t.Fatal("the fixed certificate was not counted as loaded")
			}
			// With the one in use expired, a certificate without the names
			// is taken (there is nothing better), with an error.
			if _, err := ca.Issue(base, testcerts.LeafOptions{Server: true, Hosts: []string{"other.example"}}); err != nil {
				t.Fatal(err)
			}
			recheck(r, time.Now().Add(48*time.Hour))
			if got := r.Certificate(); got == nil || !slices.Equal(got.Leaf.DNSNames, []string{"other.example"}) {
				t.Fatal("with the previous certificate expired, the new one was not taken")
			}
			if !strings.Contains(logs.String(), "but the previous one is no longer valid: new connections use it") ||
				metricValue(t, reg, "beacon_tls_reloads_total", "loaded_names_missing") != 1 {
				t.Fatalf("taking a certificate without the names was not logged and counted:\n%s", logs.String())
			}
		})
	}
}

func TestListenerNames(t *testing.T) {
	got := ListenerNames("0.0.0.0:9379", "LOCALHOST", "beacon.example.", "*", "[::1]", "localhost", "")
	want := []string{"localhost", "beacon.example", "::1"}
	if !slices.Equal(got, want) {
		t.Fatalf("ListenerNames = %q, want %q", got, want)
	}
	if got := ListenerNames("10.0.0.5:443"); !slices.Equal(got, []string{"10.0.0.5"}) {
		t.Fatalf("ListenerNames of a specific address = %q", got)
	}
}

// metricValue reads a counter or gauge of reg by name and, for the
// reloads counter, outcome.
func metricValue(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := outcome == ""
			for _, l := range m.GetLabel() {
				ok = ok || l.GetName() == "outcome" && l.GetValue() == outcome
			}
			if !ok {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
