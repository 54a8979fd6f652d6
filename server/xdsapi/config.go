package xdsapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// Defaults of the xDS interface.
const (
	// DefaultAddr is where `beacon serve` serves xDS (gRPC, ADS).
	DefaultAddr = "127.0.0.1:9380"
	// DefaultMaxStreams bounds the ADS streams open at once.
	DefaultMaxStreams = 100_000
	// DefaultMaxStreamsPerClient bounds those of one client address, so
	// that one client cannot take every stream; a process needs one.
	DefaultMaxStreamsPerClient = 1_000
	// DefaultMaxNamesPerStream bounds the resource names one stream
	// subscribes to, over all its types (a client that wants every
	// service subscribes to the wildcard instead); a name costs the
	// server about 110 bytes.
	DefaultMaxNamesPerStream = 100_000
	// DefaultMaxNamesPerClient bounds those of every stream of one
	// client address together, so that one client cannot take the
	// server's memory by opening streams.
	DefaultMaxNamesPerClient = 100_000
	// DefaultPermissionRecheck is how long a stream trusts its client's
	// permission to read a namespace before it asks again.
	DefaultPermissionRecheck = 30 * time.Second
	// DefaultAckTimeout is how long a response may wait for its ACK or
	// NACK while newer state is held back before the stream is ended.
	DefaultAckTimeout = time.Minute
)

// Access is what one client may read, decided once per stream by
// Config.Authorize.
type Access interface {
	// Readable reports whether the client may read the instances of a
	// namespace. An error (the authority unreachable) is retried: the
	// stream sends nothing until the answer is known.
	Readable(ctx context.Context, namespace string) (bool, error)
	// Release is called once when the stream ends.
	Release()
}

// Config configures a Server. The zero value serves every namespace to
// every client, with the defaults above.
type Config struct {
	// Authorize decides what the client of a new stream may read, from
	// the stream's context (its peer, TLS state and metadata). An error
	// ends the stream: return a gRPC status (Unauthenticated,
	// PermissionDenied, Unavailable) that says what to do. A nil Access,
	// or a nil Authorize, lets the client read every namespace.
	Authorize func(ctx context.Context) (Access, error)
	// PermissionRecheck is how long a stream trusts an Access's answer
	// about a namespace: a permission granted or revoked applies to its
	// subscriptions within this. DefaultPermissionRecheck when zero.
	PermissionRecheck time.Duration
	// ServerOptions are given to the gRPC server that Serve starts
	// (credentials, for one).
	ServerOptions []grpc.ServerOption
	// MaxStreams bounds the streams open at once; DefaultMaxStreams when
	// zero.
	MaxStreams int
	// MaxStreamsPerClient bounds the streams of one client address (one
	// past it is refused with ResourceExhausted);
	// DefaultMaxStreamsPerClient when zero, no bound when negative.
	MaxStreamsPerClient int
	// MaxNamesPerStream bounds the names one stream subscribes to, over
	// all its types; DefaultMaxNamesPerStream when zero.
	MaxNamesPerStream int
	// MaxNamesPerClient bounds the names the streams of one client
	// address subscribe to together; DefaultMaxNamesPerClient when zero,
	// no bound when negative. A request past either bound ends its stream
	// with ResourceExhausted.
	MaxNamesPerClient int
	// AckTimeout is how long a response may wait for the client's ACK or
	// NACK while newer state waits, before the stream is ended with
	// DeadlineExceeded; DefaultAckTimeout when zero.
	AckTimeout time.Duration
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// Metrics receives the server's metrics (beacon_xds_*); nil registers
	// none.
	Metrics prometheus.Registerer
	// SettingName names a setting in what the server says while it runs
	// (answers, logs): it is given a field ("xdsapi.Config.MaxStreams") and returns
	// what an operator changes (beacon serve: the flag). Nil, or "", names
	// the field.
	SettingName func(field string) string
}

func (c Config) withDefaults() Config {
	c.MaxStreams = cmp.Or(c.MaxStreams, DefaultMaxStreams)
	c.MaxStreamsPerClient = cmp.Or(c.MaxStreamsPerClient, DefaultMaxStreamsPerClient)
	c.MaxNamesPerStream = cmp.Or(c.MaxNamesPerStream, DefaultMaxNamesPerStream)
	c.MaxNamesPerClient = cmp.Or(c.MaxNamesPerClient, DefaultMaxNamesPerClient)
	c.AckTimeout = cmp.Or(c.AckTimeout, DefaultAckTimeout)
	c.PermissionRecheck = cmp.Or(c.PermissionRecheck, DefaultPermissionRecheck)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// Validate returns every problem with the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.MaxStreams < 0 {
		errs = append(errs, fmt.Errorf("xds: MaxStreams %d: must not be negative (0 for the default, %d)", c.MaxStreams, DefaultMaxStreams))
	}
	if c.MaxNamesPerStream < 0 {
		errs = append(errs, fmt.Errorf("xds: MaxNamesPerStream %d: must not be negative (0 for the default, %d)", c.MaxNamesPerStream, DefaultMaxNamesPerStream))
	}
	if c.PermissionRecheck < 0 {
		errs = append(errs, fmt.Errorf("xds: PermissionRecheck %v: must not be negative (0 for the default, %v)", c.PermissionRecheck, DefaultPermissionRecheck))
	}
	if c.AckTimeout < 0 {
		errs = append(errs, fmt.Errorf("xds: AckTimeout %v: must not be negative (0 for the default, %v)", c.AckTimeout, DefaultAckTimeout))
	}
	return errors.Join(errs...)
}
