package main

import (
	"context"
	"os"
	"time"

	"github.com/beaconplane/beacon/internal/gcpace"

	"github.com/beaconplane/beacon/proxy"
	"github.com/spf13/cobra"
)

// addProxyPerfFlags adds the proxy's watch, cache and profiling flags.
func addProxyPerfFlags(cmd *cobra.Command, cfg *proxy.Config) {
	var cache bool
	f := cmd.Flags()
	f.BoolVar(&cfg.EnablePprof, "pprof", false, "serve Go runtime profiles under /debug/pprof/ (like etcd's --enable-pprof)")
	f.BoolVar(&cfg.EnablePprof, "enable-pprof", false, "same as --pprof (etcd's name)")
	_ = f.MarkHidden("enable-pprof")
	f.DurationVar(&cfg.WatchSilenceTimeout, "watch-silence-timeout", proxy.DefaultWatchSilence,
		"move the upstream watches off a member that sends nothing for this long, not even an answer to a progress request (0: default; negative: never)")
	f.DurationVar(&cfg.KeepAliveSilenceTimeout, "keepalive-silence-timeout", proxy.DefaultKeepAliveSilence,
		"move the shared upstream lease keep-alive stream off a member that leaves a keep-alive unanswered this long (0: default; negative: never)")
	f.BoolVar(&cache, "serializable-cache", true, "answer serializable ranges from a watch-fed copy of the keyspace, no staler than --cache-max-staleness (linearizable reads and reads with credentials are always forwarded)")
	f.DurationVar(&cfg.CacheMaxStaleness, "cache-max-staleness", proxy.DefaultCacheMaxStaleness, "bound on how stale a cached serializable read may be")
	f.Int64Var(&cfg.CacheMaxBytes, "cache-max-bytes", proxy.DefaultCacheMaxBytes, "largest keyspace the serializable cache copies (larger turns it off)")
	prev := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if prev != nil {
			if err := prev(cmd, args); err != nil {
				return err
			}
		}
		if cfg.CacheMaxStaleness < 0 {
			return usagef("--cache-max-staleness %v: must not be negative (use --serializable-cache=false to turn the cache off)", cfg.CacheMaxStaleness)
		}
		if cfg.CacheMaxStaleness > 0 && cfg.CacheMaxStaleness < 10*time.Millisecond {
			return usagef("--cache-max-staleness %v: at least 10ms (the cache confirms itself twice per bound)", cfg.CacheMaxStaleness)
		}
		if cfg.CacheMaxBytes <= 0 {
			return usagef("--cache-max-bytes %d: must be positive (use --serializable-cache=false to turn the cache off)", cfg.CacheMaxBytes)
		}
		if !cache {
			cfg.CacheMaxStaleness = -1
		}
		return nil
	}
}

// proxyGC paces the proxy's collector unless the environment sets GOGC.
// The proxy's live heap is small with few watchers (3-6 MiB with 1000,
// gctrace) while watch fan-out allocates per delivered event: at Go's
// default GOGC of 100 it collected every half second at 50 puts/s to 1000
// watchers (marks of 2-9 ms), and a fan-out overlapping a mark on a 2-core
// machine made the delivery tail, which GOGC 400 removed. With 100,000
// watchers (150 MiB live) a fixed 400 let the proxy grow to 1.29x etcd's
// grpc-proxy's memory after a burst, against 0.62x at 100. So the heap
// gets a fixed headroom of 32 MiB over what is live, as GOGC between 100
// and 400, set again every second.
var proxyGC = gcpace.Pacer{Min: 100, Max: 400, Headroom: 32 << 20}

// paceProxyGC runs proxyGC until ctx ends unless the environment sets
// GOGC; the returned stop ends it and waits for it.
func paceProxyGC(ctx context.Context) (stop func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		proxyGC.Run(ctx, time.Second)
	}()
	return func() { cancel(); <-done }
}
