package server

import (
	"log/slog"
	"net"

	"github.com/beaconplane/beacon/internal/connlimit"
)

// limitConns bounds the HTTP listener's connections: n in all, perAddr
// from one client address (internal/connlimit). A bound reached closes an
// idle connection (silent ones first) to make room; requests are marked by
// connlimit.Handler (serveEarly), so that one in flight is never closed.
func limitConns(ln net.Listener, n, perAddr int, log *slog.Logger) net.Listener {
	return connlimit.Listener(ln, connlimit.Config{Max: n, PerAddr: perAddr, Marked: true, Log: log, What: "HTTP"})
}
