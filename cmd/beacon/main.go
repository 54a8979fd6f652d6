// Command beacon is the Beacon discovery plane in one binary: the server
// (embedded etcd, HTTP API, metrics), the registry CLI (register, ls, watch),
// cluster bootstrap tokens, the etcd proxy and benchmarks.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		// One line, whatever the error: several problems (errors.Join)
		// are listed with "; " between them.
		fmt.Fprintln(os.Stderr, "beacon:", strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; "))
		os.Exit(1)
	}
}
