package main

import (
	"github.com/beaconplane/beacon/server"
	"github.com/spf13/cobra"
)

// addPerfFlags adds serve's profiling and benchmarking flags, with etcd's
// names where etcd has them.
func addPerfFlags(cmd *cobra.Command, cfg *server.Config) {
	f := cmd.Flags()
	f.BoolVar(&cfg.EnablePprof, "pprof", false, "serve Go runtime profiles under /debug/pprof/ on --http-addr (like etcd's --enable-pprof)")
	f.BoolVar(&cfg.EnablePprof, "enable-pprof", false, "same as --pprof (etcd's name)")
	f.BoolVar(&cfg.UnsafeNoFsync, "unsafe-no-fsync", false, "embedded etcd does not sync its WAL to disk (data may be lost on a crash; for benchmarks and tests)")
	_ = f.MarkHidden("enable-pprof")
}
