// Command server is the greeter example's server: it serves
// greeter.Greeter and registers itself as beacon:///demo/greeter/grpc in
// the registry over etcd (ETCD_ENDPOINTS, default http://localhost:2379,
// which `beacon serve` listens on). On Ctrl-C it drains, deregisters and
// stops without failing a call.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/beaconplane/beacon/examples/greeter"
	"github.com/beaconplane/beacon/store/etcd"
)

func main() {
	cfg := greeter.ServerConfig{Etcd: etcd.ConfigFromEnv()}
	endpoints := flag.String("endpoints", strings.Join(cfg.Etcd.Endpoints, ","), "etcd endpoints, comma separated (env ETCD_ENDPOINTS; default http://localhost:2379)")
	flag.StringVar(&cfg.Addr, "addr", "127.0.0.1:0", "listen address (port 0: any free port)")
	flag.StringVar(&cfg.Advertise, "advertise", "", "address clients dial (default: the listen address)")
	flag.StringVar(&cfg.Name, "name", "", "server name shown in replies (default: the listen address)")
	flag.DurationVar(&cfg.DrainGrace, "drain-grace", greeter.DefaultDrainGrace, "how long to stay registered as draining before stopping")
	flag.Parse()
	if *endpoints != "" {
		cfg.Etcd.Endpoints = strings.Split(*endpoints, ",")
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := greeter.RunServer(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "greeter server:", err)
		os.Exit(1)
	}
}
