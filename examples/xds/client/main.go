// Command client is the xDS example's Go client: it dials
// xds:///grpc.greeter.demo with grpc-go's own xDS support — no Beacon
// library — and calls the greeter example's SayHello in a loop. The
// bootstrap file named by GRPC_XDS_BOOTSTRAP points it at Beacon
// (beacon xds bootstrap writes one); see docs/xds.md.
//
//	beacon serve &
//	go run ./examples/greeter/server --addr 127.0.0.1:50051 --name one &
//	beacon xds bootstrap > xds-bootstrap.json
//	GRPC_XDS_BOOTSTRAP=$PWD/xds-bootstrap.json go run ./examples/xds/client
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/examples/greeter"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers
)

func main() {
	target := flag.String("target", "xds:///grpc.greeter.demo", "gRPC target")
	count := flag.Int("count", 0, "stop after this many calls (0: until Ctrl-C)")
	interval := flag.Duration("interval", 500*time.Millisecond, "time between calls")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *target, *count, *interval); err != nil {
		fmt.Fprintln(os.Stderr, "xds client:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, target string, count int, interval time.Duration) error {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	for i := 0; count == 0 || i < count; i++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		reply, err := greeter.SayHello(cctx, cc, &greeter.HelloRequest{Name: "xds-go"}, grpc.WaitForReady(true))
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			fmt.Println("error:", err)
		} else {
			fmt.Printf("reply from %s: %s\n", reply.Server, reply.Message)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
	return nil
}
