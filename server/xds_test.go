package server

import (
	"context"
	"encoding/json"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/testcerts"
	"github.com/beaconplane/beacon/naming/namingtest"
	"github.com/beaconplane/beacon/server/xdsapi"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/types/known/anypb"
)

// xdsConfig is testConfig with xDS on a free loopback port.
func xdsConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.XDS.Addr = "127.0.0.1:0"
	return cfg
}

// listeners opens an ADS stream to addr (with the given authorization
// metadata, if any, and transport credentials), asks for the Listeners
// named, and returns those the server answered with, or the stream's
// error.
func listeners(t *testing.T, addr, authorization string, creds grpccreds.TransportCredentials, names ...string) ([]string, error) {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if authorization != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", authorization)
	}
	resp, err := xdsapi.Fetch(ctx, cc, xdsapi.ListenerType, names...)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range resp.GetResources() {
		l := &listenerv3.Listener{}
		if err := r.UnmarshalTo(l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l.GetName())
	}
	slices.Sort(out)
	return out, nil
}

// beacon serve serves xDS from its registry: an instance registered over
// the HTTP API is routed to by a grpc-go xDS client, /readyz and the
// banner say where xDS is.
func TestXDSServesTheRegistry(t *testing.T) {
	s := startServer(t, xdsConfig(t))
	b := namingtest.Start(t, "one")
	reg, err := s.Registry().Register(context.Background(), beacon.Instance{Namespace: "demo", Component: "greeter", Endpoint: "grpc", Address: b.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	boot, err := xdsapi.Bootstrap(xdsapi.BootstrapConfig{Server: s.XDSAddr()})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := xds.NewXDSResolverWithConfigForTesting(boot)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///grpc.greeter.demo", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := namingtest.ReachAll(ctx, cc, "one"); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, s.Endpoints().HTTP+"/readyz")
	var res readiness
	if err := json.Unmarshal([]byte(body), &res); err != nil || code != 200 || res.Checks["xds"] != "ok" {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	if banner := s.Banner(); !strings.Contains(banner, "xDS           "+s.XDSAddr()) {
		t.Fatalf("the banner does not say where xDS is:\n%s", banner)
	}
}

// Under --auth an xDS client sees only the namespaces its etcd user may
// read: credentials in the authorization metadata, as on the HTTP API.
func TestXDSAuthorization(t *testing.T) {
	cfg := authConfig(t)
	cfg.XDS.Addr = "127.0.0.1:0"
	s := startServer(t, cfg)
	root := rootClient(t, s)
	grant(t, root, "alice", "alice-pw", "read /services/team-a/")
	addr := s.XDSAddr()
	both := []string{"grpc.web.team-a", "grpc.web.team-b"}

	got, err := listeners(t, addr, basic("alice", "alice-pw"), nil, both...)
	if err != nil || !slices.Equal(got, []string{"grpc.web.team-a"}) {
		t.Fatalf("alice (reads team-a) was answered %v, %v; want team-a only", got, err)
	}
	got, err = listeners(t, addr, basic("root", rootPassword), nil, both...)
	if err != nil || !slices.Equal(got, both) {
		t.Fatalf("root was answered %v, %v; want both", got, err)
	}
	for _, c := range []struct{ name, auth, want string }{
		{"no credentials", "", "authorization metadata"},
		{"wrong password", basic("alice", "nope"), ""},
		{"unknown scheme", "Digest x", "not supported"},
	} {
		_, err := listeners(t, addr, c.auth, nil, both...)
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want Unauthenticated saying %q", c.name, err, c.want)
		}
	}
}

// xDS over mutual TLS: the client certificate's common name is its etcd
// user (with JWT tokens, which let the server act as a user without its
// password), and a grpc-go client reads TLS credentials from the bootstrap
// that `beacon xds bootstrap` writes.
func TestXDSMutualTLS(t *testing.T) {
	p := newPKI(t)
	cfg := authConfig(t)
	cfg.Security.AuthToken = "jwt"
	cfg.XDS.Addr = "127.0.0.1:0"
	cfg.Security.XDSTLS = TLSFiles{CertFile: p.server.Cert, KeyFile: p.server.Key, TrustedCAFile: p.ca.File, ClientCertAuth: true}
	s := startServer(t, cfg)
	grant(t, rootClient(t, s), "alice", "alice-pw", "read /services/team-a/")
	alice, err := p.ca.Issue("alice", testcerts.LeafOptions{CommonName: "alice", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	creds := grpccreds.NewTLS(tlsClient(t, p.ca.File, &alice, ""))
	got, err := listeners(t, s.XDSAddr(), "", creds, "grpc.web.team-a", "grpc.web.team-b")
	if err != nil || !slices.Equal(got, []string{"grpc.web.team-a"}) {
		t.Fatalf("alice's certificate was answered %v, %v; want team-a only", got, err)
	}
	if _, err := listeners(t, s.XDSAddr(), "", grpccreds.NewTLS(tlsClient(t, p.ca.File, &p.stranger, "")), "grpc.web.team-a"); err == nil {
		t.Fatal("a certificate of another CA was accepted")
	}
	if _, err := listeners(t, s.XDSAddr(), "", nil, "grpc.web.team-a"); err == nil {
		t.Fatal("plain text was accepted on the TLS listener")
	}

	// grpc-go's own xDS client, with the bootstrap's TLS credentials.
	b := namingtest.Start(t, "one")
	reg, err := s.Registry().Register(context.Background(), beacon.Instance{Namespace: "team-a", Component: "web", Endpoint: "grpc", Address: b.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	boot, err := xdsapi.Bootstrap(xdsapi.BootstrapConfig{Server: s.XDSAddr(), CACertFile: p.ca.File, CertFile: alice.Cert, KeyFile: alice.Key})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := xds.NewXDSResolverWithConfigForTesting(boot)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///grpc.web.team-a", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := namingtest.ReachAll(ctx, cc, "one"); err != nil {
		t.Fatal(err)
	}
}

// TestXDSIdleFloodDoesNotLockOutClients: a local process holding idle
// connections to the xDS port (as many as one address may hold) does not
// lock out the other local clients: a new connection takes the place of
// the oldest one that never carried a stream, never of one streaming.
// Before, the listener shed nothing, and a client waited for the gRPC
// handshake timeout (10 s) to clear a place, seeing "broken pipe".
func TestXDSIdleFloodDoesNotLockOutClients(t *testing.T) {
	cfg := xdsConfig(t)
	cfg.XDS.MaxStreamsPerClient = 4
	s := startServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One client streaming, then a flood filling the address's places.
	cc, err := grpc.NewClient(s.XDSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: xdsapi.ListenerType}); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: xdsapi.ListenerType, VersionInfo: first.GetVersionInfo(),
		ResponseNonce: first.GetNonce()}); err != nil { // ACK
		t.Fatal(err)
	}
	var d net.Dialer
	for range 3 {
		c, err := d.DialContext(ctx, "tcp", s.XDSAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	for i := range 3 { // each takes an idle place, and ends
		if _, err := listeners(t, s.XDSAddr(), "", nil, "nothing.here"); err != nil {
			t.Fatalf("client %d past a flood of idle connections: %v", i+1, err)
		}
	}
	// The streaming client kept its connection: a change still reaches it.
	reg, err := s.Registry().Register(ctx, beacon.Instance{Namespace: "flood", Component: "api", Endpoint: "grpc", Address: "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("the streaming client, after the flood: %v", err)
		}
		if slices.ContainsFunc(resp.GetResources(), func(a *anypb.Any) bool {
			l := &listenerv3.Listener{}
			return a.UnmarshalTo(l) == nil && strings.HasPrefix(l.GetName(), "grpc.api.flood")
		}) {
			return
		}
	}
}
