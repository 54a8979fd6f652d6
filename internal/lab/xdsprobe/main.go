// Command xdsprobe is a proxyless gRPC client that `beacon bench xds` runs
// in a process of its own, beside the benchmark: grpc-go's xDS resolver
// and balancers (google.golang.org/grpc/xds), which the beacon binary does
// not link. It dials one xds:/// target and keeps calling it from several
// goroutines, each call a grpc.health.v1 check tagged for the benchmark's
// namingtest backends, which time the calls they receive. It stops when its
// standard input closes, or on SIGINT or SIGTERM.
//
//	GRPC_XDS_BOOTSTRAP=bootstrap.json xdsprobe --target xds:///grpc.svc.ns --callers 8 --pace 1ms --tag xds
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/naming/namingtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers
)

func main() {
	target := flag.String("target", "", "xds:/// target to call (required)")
	callers := flag.Int("callers", 8, "goroutines calling the target")
	pace := flag.Duration("pace", time.Millisecond, "pause after each call")
	tag := flag.String("tag", "xds", "client tag the backends count calls under")
	flag.Parse()
	if *target == "" || *callers < 1 || *pace < 0 {
		fmt.Fprintln(os.Stderr, "xdsprobe: --target is required, --callers must be at least 1 and --pace not negative")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { // the benchmark closes stdin to stop the probe
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	if err := run(ctx, *target, *callers, *pace, *tag); err != nil {
		fmt.Fprintln(os.Stderr, "xdsprobe:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, target string, callers int, pace time.Duration, tag string) error {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	fmt.Println("calling", target)
	tagged := namingtest.Tag(ctx, tag)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			t := time.NewTicker(max(pace, time.Microsecond))
			defer t.Stop()
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(tagged, 2*time.Second)
				_, _ = namingtest.Call(cctx, cc)
				cancel()
				select {
				case <-t.C:
				case <-ctx.Done():
				}
			}
		})
	}
	wg.Wait()
	return nil
}
