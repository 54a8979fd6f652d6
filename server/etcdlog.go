package server

import (
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/beaconplane/beacon/internal/zapslog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Embedded etcd logs a few messages at WARN and ERROR that are not
// problems for `beacon serve`: two at every start, about choices Beacon
// makes on purpose, and, while Close stops it, one per listener whose
// serving loop ends because its listener was closed. They are passed on
// one level lower (start: info; shutdown: debug), so that a clean start
// logs no warning and a clean Ctrl-C no error. Every other message, and
// these outside their moment, keep their level.

// benignAtStart are etcd's start-up warnings about Beacon's deliberate
// choices: etcd's client API and its gRPC gateway on one port (what every
// etcd v3 client expects of 2379), and the "simple" auth token type (the
// default; it matters only with authentication enabled).
var benignAtStart = []string{
	"Running http and grpc server on single port. This is not recommended for production.",
	"simple token is not cryptographically signed",
}

// benignAtClose are messages etcd logs when its listeners are closed by
// its own Close: each serving loop reports that it ended, a stop right
// after the start cancels the member's first publications, and a member
// of a cluster closes its streams to its peers (and refuses the peers'
// attempts to reconnect once its transport has forgotten them). The other
// members' own messages about the departure keep their level.
var benignAtClose = []string{
	"failed to update cluster version",
	"failed to publish local member to cluster through raft",
	"setting up serving from embedded etcd failed.",
	"stopping insecure grpc server due to error",
	"stopped insecure grpc server due to error",
	"stopping secure grpc server due to error",
	"stopped secure grpc server due to error",
	"closed TCP streaming connection with remote peer",
	"lost TCP streaming connection with remote peer",
	"peer became inactive (message send to peer failed)",
	"failed to find remote peer in cluster",
}

// etcdLogger returns the zap logger given to embedded etcd: its entries at
// min or above go to l, with the benign messages above lowered while
// closing reports false (start) or true (shutdown).
func etcdLogger(l *slog.Logger, min zapcore.Level, closing *atomic.Bool) *zap.Logger {
	return zap.New(&quietCore{Core: zapslog.New(l, min).Core(), closing: closing})
}

type quietCore struct {
	zapcore.Core
	closing *atomic.Bool
}

func (c *quietCore) With(fields []zapcore.Field) zapcore.Core {
	return &quietCore{Core: c.Core.With(fields), closing: c.closing}
}

func (c *quietCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Level >= zapcore.WarnLevel {
		e.Level = c.level(e)
	}
	return c.Core.Check(e, ce)
}

// level is the level e is passed on at.
func (c *quietCore) level(e zapcore.Entry) zapcore.Level {
	msg := strings.TrimSpace(e.Message)
	for _, m := range benignAtStart {
		if msg == m && e.Level == zapcore.WarnLevel {
			return zapcore.InfoLevel
		}
	}
	if c.closing.Load() {
		for _, m := range benignAtClose {
			if msg == m {
				return zapcore.DebugLevel
			}
		}
	}
	return e.Level
}
