package bootstrap

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Defaults, the same as etcd's --discovery-* flags, except the retry
// backoff cap, which etcd fixes at 256 s.
const (
	DefaultDialTimeout      = 2 * time.Second
	DefaultRequestTimeout   = 5 * time.Second
	DefaultKeepAliveTime    = 2 * time.Second
	DefaultKeepAliveTimeout = 6 * time.Second
	// DefaultRetryBackoff is the wait after the first failure to reach
	// the discovery service; it doubles with each further failure.
	DefaultRetryBackoff = 2 * time.Second
	// DefaultMaxRetryBackoff caps the wait between retries (etcd: 256 s).
	DefaultMaxRetryBackoff = 256 * time.Second
)

// Config says how to reach a discovery service and which token to use. The
// fields mirror etcd's --discovery-* flags; the zero value of every field
// but Token and Endpoints (or Client) is etcd's default.
type Config struct {
	// Token is the discovery token (--discovery-token). Required.
	Token string
	// Endpoints are the discovery service's client URLs
	// (--discovery-endpoints), e.g. "http://10.0.0.1:2379" or
	// "10.0.0.1:2379". Required unless Client is set.
	Endpoints []string
	// Client, when set, is used instead of dialing Endpoints (the dial,
	// keep-alive, TLS and credential fields are then ignored). Join and
	// GetCluster do not close it.
	Client *clientv3.Client

	// DialTimeout bounds connecting (--discovery-dial-timeout); zero
	// means DefaultDialTimeout.
	DialTimeout time.Duration
	// RequestTimeout bounds each request, not the wait for peers
	// (--discovery-request-timeout); zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// KeepAliveTime and KeepAliveTimeout are the gRPC keep-alive settings
	// (--discovery-keepalive-time, --discovery-keepalive-timeout); zero
	// means DefaultKeepAliveTime and DefaultKeepAliveTimeout.
	KeepAliveTime    time.Duration
	KeepAliveTimeout time.Duration

	// CertFile, KeyFile and CACertFile are PEM files for TLS
	// (--discovery-cert, --discovery-key, --discovery-cacert). Setting
	// any of them enables TLS.
	CertFile, KeyFile, CACertFile string
	// SecureTransport uses TLS (with the system's root CAs unless
	// CACertFile is set) even when no file is given. It is the negation of
	// etcd's --discovery-insecure-transport, whose default (true) is the
	// zero value here. Endpoints written https:// always use TLS, and
	// http:// never do, whatever this says (as in etcd's client).
	SecureTransport bool
	// InsecureSkipTLSVerify accepts any server certificate
	// (--discovery-insecure-skip-tls-verify). For tests only.
	InsecureSkipTLSVerify bool

	// User and Password authenticate to the discovery service
	// (--discovery-user, --discovery-password). As etcd's help text
	// documents, User may be "user:password" when Password is empty.
	User, Password string

	// RetryBackoff is the wait after the first failure to reach the
	// service; it doubles after each further failure up to
	// MaxRetryBackoff, with up to 10% random extra, and resets after a
	// success. Zero means DefaultRetryBackoff and DefaultMaxRetryBackoff
	// (etcd's schedule: 2 s, 4 s, … 256 s). Waiting is always bounded by
	// the context given to Join or GetCluster.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration

	// Logger receives warnings about skipped registry entries and
	// retries, and progress at debug level; nil discards.
	Logger *slog.Logger
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if err := ValidateToken(c.Token); err != nil {
		return err
	}
	if c.Client == nil {
		if len(c.Endpoints) == 0 {
			return invalid(ErrInvalidConfig, "no discovery endpoints: give the discovery service's client URLs, e.g. http://10.0.0.1:2379")
		}
		for _, ep := range c.Endpoints {
			if strings.TrimSpace(ep) == "" || strings.ContainsAny(ep, " ,") {
				return invalid(ErrInvalidConfig, "discovery endpoint %q: give one non-empty URL per endpoint", ep)
			}
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"dial timeout", c.DialTimeout}, {"request timeout", c.RequestTimeout},
		{"keep-alive time", c.KeepAliveTime}, {"keep-alive timeout", c.KeepAliveTimeout},
		{"retry backoff", c.RetryBackoff}, {"max retry backoff", c.MaxRetryBackoff},
	} {
		if d.v < 0 {
			return invalid(ErrInvalidConfig, "negative %s %v", d.name, d.v)
		}
	}
	if c.RetryBackoff > 0 && c.MaxRetryBackoff > 0 && c.MaxRetryBackoff < c.RetryBackoff {
		return invalid(ErrInvalidConfig, "max retry backoff %v is below the retry backoff %v", c.MaxRetryBackoff, c.RetryBackoff)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return invalid(ErrInvalidConfig, "give both the TLS certificate and key files, or neither")
	}
	return nil
}

func (c Config) requestTimeout() time.Duration {
	return orDefault(c.RequestTimeout, DefaultRequestTimeout)
}

func (c Config) backoff() (first, limit time.Duration) {
	first = orDefault(c.RetryBackoff, DefaultRetryBackoff)
	limit = orDefault(c.MaxRetryBackoff, DefaultMaxRetryBackoff)
	return first, max(first, limit)
}

func (c Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

func orDefault(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}

// ClientConfig returns the etcd client configuration for the endpoints,
// TLS and credentials of c (what etcd builds from its --discovery-* flags).
func (c Config) ClientConfig() (clientv3.Config, error) {
	if err := c.Validate(); err != nil {
		return clientv3.Config{}, err
	}
	if c.Client != nil {
		return clientv3.Config{}, errors.New("bootstrap: Config.Client is set; there is nothing to dial")
	}
	cc := clientv3.Config{
		Endpoints:            c.Endpoints,
		DialTimeout:          orDefault(c.DialTimeout, DefaultDialTimeout),
		DialKeepAliveTime:    orDefault(c.KeepAliveTime, DefaultKeepAliveTime),
		DialKeepAliveTimeout: orDefault(c.KeepAliveTimeout, DefaultKeepAliveTimeout),
		Username:             c.User,
		Password:             c.Password,
		Logger:               zap.NewNop(),
	}
	if cc.Password == "" {
		if u, p, ok := strings.Cut(c.User, ":"); ok {
			cc.Username, cc.Password = u, p
		}
	}
	var tlsCfg *tls.Config
	if c.CertFile != "" || c.KeyFile != "" || c.CACertFile != "" {
		info := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CACertFile, Logger: zap.NewNop()}
		cfg, err := info.ClientConfig()
		if err != nil {
			return clientv3.Config{}, fmt.Errorf("%w: discovery TLS files: %v", ErrInvalidConfig, err)
		}
		tlsCfg = cfg
	}
	if tlsCfg == nil && c.SecureTransport {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.InsecureSkipTLSVerify {
		if tlsCfg == nil {
			tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		tlsCfg.InsecureSkipVerify = true
	}
	cc.TLS = tlsCfg
	return cc, nil
}
