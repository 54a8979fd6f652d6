package greeter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
)

// Service is the registry name the example uses: beacon:///demo/greeter/grpc.
var Service = beacon.Query{Namespace: "demo", Component: "greeter", Endpoint: "grpc"}

// DefaultDrainGrace is how long a stopping server stays registered as
// draining before it deregisters and stops: long enough for clients to
// stop picking it.
const DefaultDrainGrace = 2 * time.Second

// ServerConfig configures RunServer. The zero value listens on a free
// loopback port and registers it in the etcd at localhost:2379.
type ServerConfig struct {
	// Addr is where the server listens; "127.0.0.1:0" (a free port) when
	// empty.
	Addr string
	// Advertise is the address registered for clients to dial; the
	// listener's address when empty.
	Advertise string
	// Name is put in replies and in the instance's metadata ("server");
	// the listener's address when empty.
	Name string
	// Etcd reaches the registry's store (etcd.ConfigFromEnv reads
	// ETCD_ENDPOINTS and ETCD_AUTH_*).
	Etcd etcd.Config
	// LeaseTTL is the registration's lease TTL; the registry's default
	// (10 s) when zero.
	LeaseTTL time.Duration
	// DrainGrace: see DefaultDrainGrace (used when zero).
	DrainGrace time.Duration
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// Ready, when set, is called with the registered instance once clients
	// can find it.
	Ready func(beacon.Instance)
}

type server struct{ name string }

func (s server) SayHello(_ context.Context, req *HelloRequest) (*HelloReply, error) {
	name := req.Name
	if name == "" {
		name = "world"
	}
	return &HelloReply{Message: "Hello, " + name, Server: s.name}, nil
}

// RunServer serves the greeter and registers it until ctx is done, then
// shuts down gracefully: it drains (clients stop sending new calls),
// deregisters, and finishes the calls in flight.
func RunServer(ctx context.Context, cfg ServerConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.DrainGrace == 0 {
		cfg.DrainGrace = DefaultDrainGrace
	}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("greeter: listen: %w", err)
	}
	addr := lis.Addr().String()
	if cfg.Advertise == "" {
		cfg.Advertise = addr
	}
	if cfg.Name == "" {
		cfg.Name = addr
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(Codec{}))
	srv.RegisterService(&ServiceDesc, server{name: cfg.Name})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer srv.Stop() // on early returns; after GracefulStop a no-op

	st, err := etcd.Open(ctx, cfg.Etcd)
	if err != nil {
		return fmt.Errorf("greeter: registry store: %w", err)
	}
	defer func() { _ = st.Close() }()
	reg, err := registry.New(st, registry.Config{LeaseTTL: cfg.LeaseTTL, Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = reg.Close() }()
	r, err := reg.Register(ctx, beacon.Instance{
		Namespace: Service.Namespace, Component: Service.Component, Endpoint: Service.Endpoint,
		Address: cfg.Advertise, Transport: "grpc", Metadata: map[string]string{"server": cfg.Name},
	})
	if err != nil {
		return fmt.Errorf("greeter: register: %w", err)
	}
	in := r.Instance()
	log.Info("serving and registered", "addr", addr, "instance", in.Ref().String(), "target", naming.Target(Service))
	if cfg.Ready != nil {
		cfg.Ready(in)
	}

	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("greeter: serve: %w", err)
	}
	log.Info("draining", "grace", cfg.DrainGrace)
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainGrace+10*time.Second)
	defer cancel()
	if err := r.Drain(dctx, registry.DrainGrace(cfg.DrainGrace)); err != nil {
		log.Warn("drain failed; deregistering", "err", err)
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-dctx.Done():
		srv.Stop()
	}
	log.Info("stopped")
	return nil
}

// ClientConfig configures RunClient.
type ClientConfig struct {
	// Target to dial; naming.Target(Service) when empty.
	Target string
	// Etcd reaches the registry's store.
	Etcd etcd.Config
	// Interval between calls; 500 ms when zero.
	Interval time.Duration
	// Count stops after this many calls; zero calls until ctx is done.
	Count int
	// Name is sent in each request.
	Name string
	// Out receives one line per call; nil discards them.
	Out io.Writer
	// Observe, when set, is called after each call with the server that
	// answered (empty on error) and the error.
	Observe func(server string, err error)
	// Logger receives the resolver's logs; nil discards them.
	Logger *slog.Logger
}

// ClientStats sums up a client run.
type ClientStats struct {
	Calls    int
	Failures int
	ByServer map[string]int
}

// RunClient dials the target through Beacon's resolver (round robin over
// the serving instances) and calls SayHello every Interval.
func RunClient(ctx context.Context, cfg ClientConfig) (ClientStats, error) {
	stats := ClientStats{ByServer: map[string]int{}}
	if cfg.Target == "" {
		cfg.Target = naming.Target(Service)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if _, err := naming.ParseTarget(cfg.Target); err != nil {
		return stats, err
	}
	st, err := etcd.Open(ctx, cfg.Etcd)
	if err != nil {
		return stats, fmt.Errorf("greeter: registry store: %w", err)
	}
	defer func() { _ = st.Close() }()
	reg, err := registry.New(st, registry.Config{Logger: cfg.Logger})
	if err != nil {
		return stats, err
	}
	defer func() { _ = reg.Close() }()
	resolver, err := naming.DialOption(reg, naming.WithLogger(cfg.Logger))
	if err != nil {
		return stats, err
	}
	cc, err := grpc.NewClient(cfg.Target, resolver,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		return stats, err
	}
	defer func() { _ = cc.Close() }()

	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for cfg.Count == 0 || stats.Calls < cfg.Count {
		cctx, cancel := context.WithTimeout(ctx, max(cfg.Interval, time.Second))
		var p peer.Peer
		reply, err := SayHello(cctx, cc, &HelloRequest{Name: cfg.Name}, grpc.Peer(&p))
		cancel()
		if ctx.Err() != nil {
			break
		}
		stats.Calls++
		server := ""
		if err != nil {
			stats.Failures++
			fmt.Fprintf(cfg.Out, "call failed: %v\n", err)
		} else {
			server = reply.Server
			stats.ByServer[server]++
			fmt.Fprintf(cfg.Out, "%s (from %s at %v)\n", reply.Message, reply.Server, p.Addr)
		}
		if cfg.Observe != nil {
			cfg.Observe(server, err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	if stats.Calls > 0 && stats.Failures == stats.Calls {
		return stats, errors.New("greeter: every call failed")
	}
	return stats, nil
}
