// Command beacon is the Beacon discovery plane in one binary: the server
// (embedded etcd, HTTP API, metrics), the registry CLI (register, ls, watch,
// rm), cluster bootstrap tokens, the etcd proxy and benchmarks.
package main

import (
	"context"
	"fmt"
	"os"
)

func main() {
	ctx, stop := notifySignals(context.Background(), os.Stderr) // signals.go
	err := execute(ctx, rootCmd, os.Args[1:])                   // cli.go
	stop()
	if err != nil {
		// One line, whatever the error: several problems (errors.Join)
		// are listed with "; " between them.
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(exitCode(err))
	}
}
