// Package natstest runs a real NATS server with JetStream in-process for
// tests (github.com/nats-io/nats-server/v2), on a loopback port chosen at
// start, with its store in a temporary directory, optionally with
// user/password or token authentication and TLS with client certificates.
package natstest

import (
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

// Options configure a test server.
type Options struct {
	// User and Password require this user.
	User, Password string
	// Token requires this token.
	Token string
	// TLS serves clients over TLS and requires client certificates
	// signed by the test CA (see Server.Certs).
	TLS bool
	// Domain sets a JetStream domain.
	Domain string
	// Configure adjusts the server options before start.
	Configure func(*server.Options)
}

// Server is a running in-process NATS server.
type Server struct {
	*server.Server
	certs testcerts.Files
}

// Start starts a server and shuts it down when the test ends.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	dir := tb.TempDir()
	opts := &server.Options{
		Host:            "127.0.0.1",
		Port:            server.RANDOM_PORT,
		JetStream:       true,
		JetStreamDomain: o.Domain,
		StoreDir:        filepath.Join(dir, "js"),
		NoSigs:          true,
		NoLog:           true,
		Username:        o.User,
		Password:        o.Password,
		Authorization:   o.Token,
	}
	s := &Server{}
	if o.TLS {
		certs, err := testcerts.Write(dir)
		if err != nil {
			tb.Fatalf("natstest: %v", err)
		}
		s.certs = certs
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CaFile: certs.CA, Verify: true,
		})
		if err != nil {
			tb.Fatalf("natstest: %v", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, true
	}
	if o.Configure != nil {
		o.Configure(opts)
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		tb.Fatal("natstest: server not ready after 30s")
	}
	s.Server = ns
	tb.Cleanup(s.Stop)
	return s
}

// URL is the client URL (nats:// or tls://).
func (s *Server) URL() string {
	if s.certs.CA != "" {
		return fmt.Sprintf("tls://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port)
	}
	return s.ClientURL()
}

// Certs are the TLS files when Options.TLS was set.
func (s *Server) Certs() testcerts.Files { return s.certs }

// Stop shuts the server down and waits for it.
func (s *Server) Stop() {
	s.Shutdown()
	s.WaitForShutdown()
}

// LeakOptions make goleak ignore the goroutines of an in-process server
// (they belong to the server, not to the code under test).
func LeakOptions() []goleak.Option {
	var opts []goleak.Option
	for _, f := range []string{
		"(*consumer).loopAndGatherMsgs",
		"(*consumer).processInboundAcks",
		"(*consumer).processInboundNextMsgReqs",
		"(*consumer).deleteNotActive",
		"(*client).readLoop",
		"(*client).writeLoop",
		"(*Server).createClientEx.func2",
	} {
		opts = append(opts, goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server."+f))
	}
	return opts
}

// Replace stops srv and starts, on its port, a server with o (a new, empty
// store directory): clients reconnect to it. Restarting without the
// JetStream data, or with a different server, is what a test makes of it.
func Replace(tb testing.TB, srv *Server, o Options) *Server {
	tb.Helper()
	port := srv.Addr().(*net.TCPAddr).Port
	srv.Stop()
	configure := o.Configure
	o.Configure = func(opts *server.Options) {
		opts.Port = port
		if configure != nil {
			configure(opts)
		}
	}
	return Start(tb, o)
}

// Hang replaces srv, on its port, with a server without JetStream whose
// JetStream API takes every request and answers none, as a server that
// hangs does. It returns the subjects of the requests as they come (those
// that find the channel full are dropped).
func Hang(tb testing.TB, srv *Server) <-chan string {
	tb.Helper()
	mute := Replace(tb, srv, Options{Configure: func(o *server.Options) { o.JetStream = false }})
	nc, err := nats.Connect(mute.ClientURL())
	if err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	tb.Cleanup(nc.Close)
	got := make(chan string, 1024)
	if _, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		select {
		case got <- m.Subject:
		default:
		}
	}); err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	if err := nc.Flush(); err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	return got
}
