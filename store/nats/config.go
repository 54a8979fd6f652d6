package nats

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Environment variables read by ConfigFromEnv. The NATS_* names are those
// of the nats command-line tool.
const (
	EnvURL      = "NATS_URL"
	EnvCreds    = "NATS_CREDS"
	EnvUser     = "NATS_USER"
	EnvPassword = "NATS_PASSWORD"
	EnvToken    = "NATS_TOKEN"
	EnvCA       = "NATS_CA"
	EnvCert     = "NATS_CERT"
	EnvKey      = "NATS_KEY"
	EnvDomain   = "NATS_DOMAIN"
	EnvBucket   = "BEACON_NATS_BUCKET"
	EnvReplicas = "BEACON_NATS_REPLICAS"
)

// Defaults for the zero values of Config.
const (
	DefaultURL            = "nats://127.0.0.1:4222"
	DefaultBucket         = "beacon"
	DefaultHistory        = 64
	DefaultMarkerTTL      = time.Second
	DefaultDialTimeout    = 5 * time.Second
	DefaultRequestTimeout = 5 * time.Second
	// MinHistory is the least history per key an existing bucket must
	// keep: watches resume across at most that many writes of one key.
	MinHistory = 8
)

var bucketRe = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// Config configures a NATS store. The zero value connects to a local
// server without authentication and uses the bucket "beacon".
type Config struct {
	// URL lists the servers, comma separated (nats:// or tls://).
	// Default DefaultURL.
	URL string
	// CredsFile is a NATS credentials file (JWT and NKey seed).
	CredsFile string
	// User and Password authenticate with a user name and password.
	User, Password string
	// Token authenticates with a token.
	Token string
	// CAFile verifies the server's TLS certificate; CertFile and KeyFile
	// are a client certificate. Any of them turns TLS on.
	CAFile, CertFile, KeyFile string
	// Domain is the JetStream domain, if the server uses one.
	Domain string
	// Bucket is the KV bucket (stream KV_<Bucket>). Default "beacon".
	Bucket string
	// Replicas of a bucket created by Open (1 to 5). Default 1.
	Replicas int
	// History is the number of revisions kept per key in a bucket
	// created by Open (MinHistory to 64). Default 64.
	History int
	// MarkerTTL is how long the markers the server leaves when a lease
	// expires stay in a bucket created by Open (the stream's subject delete
	// marker TTL). The server raises every message TTL to at least this, so
	// it is also the shortest lease. Default 1 s (leases are exact).
	MarkerTTL time.Duration
	// DialTimeout bounds connecting. Default 5 s.
	DialTimeout time.Duration
	// RequestTimeout bounds each request to the server (the caller's
	// context may end it sooner), and how long a watch survives a lost
	// connection. Default 5 s.
	RequestTimeout time.Duration
	// MustExist makes the store a reader of an existing bucket: Open
	// fails with an error matching ErrNoBucket when the bucket does not
	// exist instead of creating it, and the store never creates it later.
	// For programs that only read or remove (beacon ls, beacon watch,
	// beacon rm), so that a mistyped bucket is an error rather than an
	// empty listing and a new bucket. Without it a store creates a missing
	// bucket at Open, and again when the bucket goes away while it runs.
	MustExist bool
	// Name is the client connection name shown by the server.
	Name string
	// Logger receives connection events. Nil discards them.
	Logger *slog.Logger

	envErr error // a bad environment variable, reported by Validate
	// envs names the variable each field was read from (ConfigFromEnv), so
	// that Validate's messages name what the user set.
	envs map[string]string
}

// setting names a field's value as the user gave it: VARIABLE="value" when
// ConfigFromEnv read it from the environment, else desc "value".
func (c Config) setting(field, desc, val string) string {
	if v := c.envs[field]; v != "" {
		return fmt.Sprintf("%s=%q", v, val)
	}
	return fmt.Sprintf("%s %q", desc, val)
}

// Validate checks the configuration.
func (c Config) Validate() error {
	errs := []error{c.envErr}
	for _, u := range strings.Split(c.URL, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			if c.URL != "" {
				errs = append(errs, fmt.Errorf("nats: URL %q has an empty entry", c.URL))
			}
			continue
		}
		p, err := url.Parse(u)
		if err != nil || p.Host == "" {
			errs = append(errs, fmt.Errorf("nats: %s is not a URL like nats://host:4222", c.setting("URL", "server URL", u)))
			continue
		}
		switch p.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			errs = append(errs, fmt.Errorf("nats: %s: scheme must be nats, tls, ws or wss", c.setting("URL", "server URL", u)))
		}
	}
	if (c.User == "") != (c.Password == "") {
		errs = append(errs, errors.New("nats: set both user and password, or neither"))
	}
	if n := btoi(c.User != "") + btoi(c.Token != "") + btoi(c.CredsFile != ""); n > 1 {
		errs = append(errs, errors.New("nats: choose one of user/password, token and credentials file"))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("nats: a client certificate needs both the certificate and the key file"))
	}
	for _, f := range []struct{ field, desc, path string }{
		{"CredsFile", "credentials file", c.CredsFile}, {"CAFile", "CA file", c.CAFile},
		{"CertFile", "certificate file", c.CertFile}, {"KeyFile", "key file", c.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			errs = append(errs, fmt.Errorf("nats: %s: %w", c.setting(f.field, f.desc, f.path), err))
		}
	}
	if c.Bucket != "" && !bucketRe.MatchString(c.Bucket) {
		errs = append(errs, fmt.Errorf("nats: %s: use letters, digits, '-' and '_'", c.setting("Bucket", "bucket name", c.Bucket)))
	}
	if (c.Replicas < 0 || c.Replicas > 5) && c.envErr == nil {
		errs = append(errs, fmt.Errorf("nats: %s: must be 1 to 5", c.setting("Replicas", "replicas", strconv.Itoa(c.Replicas))))
	}
	if c.History != 0 && (c.History < MinHistory || c.History > 64) {
		errs = append(errs, fmt.Errorf("nats: history %d: must be %d to 64", c.History, MinHistory))
	}
	if c.MarkerTTL != 0 && (c.MarkerTTL < time.Second || c.MarkerTTL%time.Second != 0) {
		errs = append(errs, fmt.Errorf("nats: marker TTL %v: must be whole seconds, at least 1s", c.MarkerTTL))
	}
	if c.DialTimeout < 0 || c.RequestTimeout < 0 {
		errs = append(errs, errors.New("nats: timeouts must not be negative"))
	}
	return errors.Join(errs...)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (c Config) withDefaults() Config {
	c.URL = cmp.Or(c.URL, DefaultURL)
	c.Bucket = cmp.Or(c.Bucket, DefaultBucket)
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.History = cmp.Or(c.History, DefaultHistory)
	c.MarkerTTL = cmp.Or(c.MarkerTTL, DefaultMarkerTTL)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// ConfigFromEnv reads the configuration from NATS_URL, NATS_CREDS,
// NATS_USER, NATS_PASSWORD, NATS_TOKEN, NATS_CA, NATS_CERT, NATS_KEY,
// NATS_DOMAIN, BEACON_NATS_BUCKET and BEACON_NATS_REPLICAS, and validates it.
// The configuration is returned even when it is invalid; its Validate
// reports the same error.
func ConfigFromEnv() (Config, error) {
	c := Config{
		URL:       os.Getenv(EnvURL),
		CredsFile: os.Getenv(EnvCreds),
		User:      os.Getenv(EnvUser),
		Password:  os.Getenv(EnvPassword),
		Token:     os.Getenv(EnvToken),
		CAFile:    os.Getenv(EnvCA),
		CertFile:  os.Getenv(EnvCert),
		KeyFile:   os.Getenv(EnvKey),
		Domain:    os.Getenv(EnvDomain),
		Bucket:    os.Getenv(EnvBucket),
		envs:      map[string]string{},
	}
	for field, env := range map[string]string{"URL": EnvURL, "CredsFile": EnvCreds, "CAFile": EnvCA, "CertFile": EnvCert,
		"KeyFile": EnvKey, "Bucket": EnvBucket, "Replicas": EnvReplicas} {
		if os.Getenv(env) != "" {
			c.envs[field] = env
		}
	}
	if v := os.Getenv(EnvReplicas); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 {
			// 0 would silently be the default, 1.
			c.envErr = fmt.Errorf("nats: %s=%q: want a number from 1 to 5", EnvReplicas, v)
		}
		c.Replicas = n
	}
	return c, c.Validate()
}
