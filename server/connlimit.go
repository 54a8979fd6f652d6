package server

import (
	"log/slog"
	"net"
	"syscall"

	"github.com/beaconplane/beacon/internal/connlimit"
)

// defaultMaxConns is a quarter of the process's open-file limit (Go
// raises the soft limit to the hard one at start), at least 256.
func defaultMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	return int(max(256, min(rl.Cur/4, 1<<20)))
}

// limitConns bounds the HTTP listener's connections: n in all, perAddr
// from one client address (internal/connlimit). A bound reached closes an
// idle connection (silent ones first) to make room; requests are marked by
// connlimit.Handler (serveEarly), so that one in flight is never closed.
func limitConns(ln net.Listener, n, perAddr int, log *slog.Logger) net.Listener {
	return connlimit.Listener(ln, connlimit.Config{Max: n, PerAddr: perAddr, Marked: true, Log: log, What: "HTTP"})
}
