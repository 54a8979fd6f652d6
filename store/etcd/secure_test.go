package etcd_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/beaconplane/beacon/store/storetest"
	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/crypto/bcrypt"
)

const (
	testUser     = "beacon"
	testPassword = "s3cret"
)

// authServer starts a server with authentication (and TLS if asked). Its
// password hashes use bcrypt's minimum cost: at etcd's default every
// authentication costs ~100 ms of CPU (seconds under -race), and the suite
// authenticates once per check, all in parallel.
func authServer(t *testing.T, useTLS bool) *etcdtest.Server {
	return etcdtest.Start(t, etcdtest.Options{
		TLS: useTLS, User: testUser, Password: testPassword,
		Configure: func(c *embed.Config) { c.BcryptCost = uint(bcrypt.MinCost) },
	})
}

// secureConfig is the configuration that reaches srv: its CA and client
// certificate if it serves TLS, and the test user if it has auth.
func secureConfig(srv *etcdtest.Server, withAuth bool) etcd.Config {
	cfg := etcd.Config{Endpoints: srv.Endpoints()}
	if c := srv.Certs(); c.CA != "" {
		cfg.CA, cfg.ClientCert, cfg.ClientKey = c.CA, c.ClientCert, c.ClientKey
	}
	if withAuth {
		cfg.Username, cfg.Password = testUser, testPassword
	}
	return cfg
}

// TestConformanceTLSAndAuth runs the whole suite over mutual TLS with
// user/password authentication: every call carries both.
func TestConformanceTLSAndAuth(t *testing.T) {
	srv := authServer(t, true)
	storetest.Run(t, factory(srv, secureConfig(srv, true)), suiteOptions)
}

// TestTLSOnlyAndAuthOnly checks each mechanism alone with a write, a read,
// a lease and a watch.
func TestTLSOnlyAndAuthOnly(t *testing.T) {
	t.Parallel()
	for _, auth := range []bool{false, true} {
		t.Run(map[bool]string{false: "tls", true: "auth"}[auth], func(t *testing.T) {
			var srv *etcdtest.Server
			if auth {
				srv = authServer(t, false)
			} else {
				srv = etcdtest.Start(t, etcdtest.Options{TLS: true})
			}
			s := newStore(t, srv, secureConfig(srv, auth))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			l, err := s.Grant(ctx, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			w := s.Watch(ctx, "/secure/", 0)
			rev, err := s.Put(ctx, "/secure/k", []byte("v"), store.WithLease(l.ID))
			if err != nil {
				t.Fatal(err)
			}
			if kv, err := s.Get(ctx, "/secure/k"); err != nil || string(kv.Value) != "v" || kv.Lease != l.ID {
				t.Fatalf("Get: %+v, %v", kv, err)
			}
			select {
			case resp := <-w:
				if resp.Err != nil || len(resp.Events) != 1 || resp.Events[0].Revision() != rev {
					t.Fatalf("watch: %+v", resp)
				}
			case <-ctx.Done():
				t.Fatal("no watch event")
			}
			if _, err := s.KeepAlive(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
			if err := s.Revoke(ctx, l.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNewFailures checks that Open fails fast and says why, for each way a
// configuration can be wrong.
func TestNewFailures(t *testing.T) {
	t.Parallel()
	tlsSrv := etcdtest.Start(t, etcdtest.Options{TLS: true})
	authSrv := authServer(t, false)
	certs := tlsSrv.Certs()
	other, err := testcerts.Write(t.TempDir()) // a CA that signed nothing of the server's
	if err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	closed := "127.0.0.1:" + strconv.Itoa(port)
	hostport := func(srv *etcdtest.Server) string { _, hp, _ := strings.Cut(srv.Endpoint(), "://"); return hp }
	const dial = 500 * time.Millisecond

	for _, tc := range []struct {
		name   string
		cfg    etcd.Config // DialTimeout 500ms unless set
		is     error
		substr []string
	}{
		{"unreachable endpoint", etcd.Config{Endpoints: []string{closed}},
			store.ErrUnavailable, []string{"http://" + closed, "did not answer within 500ms (DialTimeout)", "connection refused", "is etcd running there"}},
		{"wrong password", etcd.Config{Endpoints: authSrv.Endpoints(), Username: testUser, Password: "wrong", DialTimeout: 10 * time.Second},
			nil, []string{`authenticate as "beacon"`, "authentication failed", etcd.EnvPassword}},
		{"no credentials", etcd.Config{Endpoints: authSrv.Endpoints(), DialTimeout: 10 * time.Second},
			nil, []string{"requires authentication", etcd.EnvUsername}},
		{"missing client certificate", etcd.Config{Endpoints: tlsSrv.Endpoints(), CA: certs.CA},
			store.ErrUnavailable, []string{"certificate required", "set ClientCert and ClientKey", etcd.EnvClientCert}},
		{"wrong CA", etcd.Config{Endpoints: tlsSrv.Endpoints(), CA: other.CA, ClientCert: certs.ClientCert, ClientKey: certs.ClientKey},
			store.ErrUnavailable, []string{"unknown authority", "the CA file " + other.CA, etcd.EnvCA}},
		{"client certificate of another CA", etcd.Config{Endpoints: tlsSrv.Endpoints(), CA: certs.CA, ClientCert: other.ClientCert, ClientKey: other.ClientKey},
			store.ErrUnavailable, []string{"refused the TLS connection", "did not accept the client certificate " + other.ClientCert}},
		{"plain client, TLS server", etcd.Config{Endpoints: []string{"http://" + hostport(tlsSrv)}},
			store.ErrUnavailable, []string{"speaks TLS: use https://"}},
		{"TLS client, plain server", etcd.Config{Endpoints: []string{"https://" + hostport(server)}},
			store.ErrUnavailable, []string{"does not speak TLS: use http://"}},
		{"bad CA path", etcd.Config{Endpoints: tlsSrv.Endpoints(), CA: "/nonexistent/ca.pem"},
			etcd.ErrInvalidConfig, []string{"/nonexistent/ca.pem", etcd.EnvCA, "no such file"}},
		{"CA file without certificate", etcd.Config{Endpoints: tlsSrv.Endpoints(), CA: notPEM},
			etcd.ErrInvalidConfig, []string{notPEM, "holds no PEM certificate"}},
		{"missing client key file", etcd.Config{Endpoints: tlsSrv.Endpoints(), CA: certs.CA, ClientCert: certs.ClientCert, ClientKey: "/nonexistent/key.pem"},
			etcd.ErrInvalidConfig, []string{"/nonexistent/key.pem", etcd.EnvClientKey}},
		{"key of another certificate", etcd.Config{Endpoints: tlsSrv.Endpoints(), CA: certs.CA, ClientCert: certs.ClientCert, ClientKey: other.ClientKey},
			etcd.ErrInvalidConfig, []string{certs.ClientCert, other.ClientKey, "does not match"}},
		{"invalid config", etcd.Config{Endpoints: []string{"etcd"}},
			etcd.ErrInvalidConfig, []string{`endpoint "etcd"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.cfg.DialTimeout == 0 {
				tc.cfg.DialTimeout = dial
			}
			start := time.Now()
			s, err := etcd.Open(context.Background(), tc.cfg)
			took := time.Since(start)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			t.Logf("after %v: %v", took.Round(time.Millisecond), err)
			// The dial timeout, then at most a second of diagnosis.
			if limit := tc.cfg.DialTimeout + 2*time.Second; took > limit {
				t.Errorf("Open took %v, more than %v", took, limit)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error does not match %v", tc.is)
			}
			for _, sub := range tc.substr {
				if !strings.Contains(err.Error(), sub) {
					t.Errorf("error does not contain %q", sub)
				}
			}
		})
	}
}

// TestNewRespectsContext: a caller's deadline shorter than the dial
// timeout ends Open at the caller's deadline.
func TestNewRespectsContext(t *testing.T) {
	t.Parallel()
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = etcd.Open(ctx, etcd.Config{Endpoints: []string{"127.0.0.1:" + strconv.Itoa(port)}, DialTimeout: time.Minute})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "before the caller's deadline") {
		t.Fatalf("Open: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Open took %v with a 200ms context", took)
	}
}
