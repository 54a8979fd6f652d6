// Command client is the greeter example's client: it dials
// beacon:///demo/greeter/grpc through Beacon's gRPC resolver (registry
// over etcd: ETCD_ENDPOINTS, default http://localhost:2379) and calls
// SayHello in a loop, round robin over the serving instances.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/beaconplane/beacon/examples/greeter"
	"github.com/beaconplane/beacon/naming"
	"github.com/beaconplane/beacon/store/etcd"
)

func main() {
	cfg := greeter.ClientConfig{Etcd: etcd.ConfigFromEnv(), Out: os.Stdout}
	endpoints := flag.String("endpoints", strings.Join(cfg.Etcd.Endpoints, ","), "etcd endpoints, comma separated (env ETCD_ENDPOINTS; default http://localhost:2379)")
	flag.StringVar(&cfg.Target, "target", naming.Target(greeter.Service), "gRPC target")
	flag.DurationVar(&cfg.Interval, "interval", 0, "time between calls (default 500ms)")
	flag.IntVar(&cfg.Count, "count", 0, "stop after this many calls (0: until Ctrl-C)")
	flag.StringVar(&cfg.Name, "name", "world", "name to greet")
	flag.Parse()
	if *endpoints != "" {
		cfg.Etcd.Endpoints = strings.Split(*endpoints, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stats, err := greeter.RunClient(ctx, cfg)
	fmt.Fprintf(os.Stderr, "%d calls, %d failed, by server: %v\n", stats.Calls, stats.Failures, stats.ByServer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "greeter client:", err)
		os.Exit(1)
	}
}
