package v2

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
)

// Defaults of Config.
const (
	// DefaultPrefix is where tokens live in the store.
	DefaultPrefix = "/_beacon/discovery-v2/"
	// DefaultMaxAge is how long a token lives (discovery.etcd.io's
	// default --minage).
	DefaultMaxAge = 7 * 24 * time.Hour
	// DefaultGCInterval is how often expired tokens are deleted.
	DefaultGCInterval = 5 * time.Minute
	// DefaultWaitTimeout is how long a wait=true request is held before
	// it is answered 200 with an empty body, which etcd's client takes as
	// "poll again" (discovery.etcd.io holds one minute).
	DefaultWaitTimeout = time.Minute
	// DefaultMaxMembers bounds the registrations of one token.
	DefaultMaxMembers = 1000
)

// RegistryPath is the directory that node keys in answers are under, as on
// an etcd serving discovery: "/_etcd/registry/<token>/<member-id>".
const RegistryPath = "/_etcd/registry"

// maxValue bounds a registration value ("name=url,..."), in bytes.
const maxValue = 16 << 10

// ErrClosed is returned by a Service after Close.
var ErrClosed = errors.New("v2: service closed")

// ErrTokenNotFound reports a token that does not exist or has expired.
var ErrTokenNotFound = errors.New("v2: token not found")

// Config configures a Service.
type Config struct {
	// Store holds the tokens. Required. The Service does not close it.
	Store store.Store
	// BaseURL is the URL the service is reachable at, without a trailing
	// slash, e.g. "http://10.0.0.1:9379/v2/discovery". /new answers
	// BaseURL + "/" + token, which members use as --discovery. Required.
	BaseURL string
	// Prefix is where tokens live in the store; DefaultPrefix when empty.
	// It must end with "/".
	Prefix string
	// MaxAge is how long a token lives after /new; DefaultMaxAge when
	// zero. An expired token answers 404 at once and is deleted by the
	// next collection.
	MaxAge time.Duration
	// GCInterval is how often expired tokens are deleted;
	// DefaultGCInterval when zero.
	GCInterval time.Duration
	// WaitTimeout bounds a wait=true request; DefaultWaitTimeout when
	// zero.
	WaitTimeout time.Duration
	// MaxMembers bounds the registrations of one token;
	// DefaultMaxMembers when zero.
	MaxMembers int
	// Logger receives a line per token created, removed or expired, and
	// every store failure; nil discards.
	Logger *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Store == nil {
		return errors.New("v2: no store: set Config.Store")
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.HasSuffix(c.BaseURL, "/") ||
		u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("v2: base URL %q: want an http(s) URL without trailing slash, e.g. http://10.0.0.1:9379/v2/discovery", c.BaseURL)
	}
	if c.Prefix != "" {
		if err := store.ValidatePrefix(c.Prefix); err != nil || !strings.HasSuffix(c.Prefix, "/") {
			return fmt.Errorf("v2: prefix %q: want a store key prefix ending with '/'", c.Prefix)
		}
	}
	if c.MaxAge < 0 || c.GCInterval < 0 || c.WaitTimeout < 0 || c.MaxMembers < 0 {
		return errors.New("v2: MaxAge, GCInterval, WaitTimeout and MaxMembers must not be negative")
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.Prefix = cmp.Or(c.Prefix, DefaultPrefix)
	c.MaxAge = cmp.Or(c.MaxAge, DefaultMaxAge)
	c.GCInterval = cmp.Or(c.GCInterval, DefaultGCInterval)
	c.WaitTimeout = cmp.Or(c.WaitTimeout, DefaultWaitTimeout)
	c.MaxMembers = cmp.Or(c.MaxMembers, DefaultMaxMembers)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Service is the discovery.etcd.io-compatible service: an http.Handler
// for the v2 discovery protocol and /new, over a store.Store, with a
// collection loop that deletes expired tokens. Close stops the loop.
type Service struct {
	cfg    Config
	st     store.Store
	lg     *slog.Logger
	ctx    context.Context // ends at Close; bounds waits and collections
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// New validates cfg and starts the service's collection loop.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, st: cfg.Store, lg: cfg.Logger.With("component", "discovery-v2"), ctx: ctx, cancel: cancel}
	s.wg.Add(1)
	go s.gcLoop()
	return s, nil
}

// Close stops the collection loop and ends waiting requests; requests
// after Close get 503. It is idempotent and does not close the store.
func (s *Service) Close() error {
	s.once.Do(s.cancel)
	s.wg.Wait()
	return nil
}

// meta is the hidden record of a token.
type meta struct {
	Created time.Time `json:"created"`
	Size    int       `json:"size"`
}

// Store layout under Prefix:
//
//	tokens/<token>/_meta         {"created":"…","size":N}  (hidden)
//	tokens/<token>/_config/size  N
//	tokens/<token>/<member-id>   name=url[,name=url…]
func (s *Service) tokenPrefix(token string) string { return s.cfg.Prefix + "tokens/" + token + "/" }
func (s *Service) metaKey(token string) string     { return s.tokenPrefix(token) + "_meta" }
func (s *Service) sizeKey(token string) string     { return s.tokenPrefix(token) + "_config/size" }

// CreateToken creates a token of the given size (1 to bootstrap.MaxSize)
// and returns it: 32 random lower-case hex digits, as discovery.etcd.io.
func (s *Service) CreateToken(ctx context.Context, size int) (string, error) {
	if err := bootstrap.ValidateSize(size); err != nil {
		return "", err
	}
	if s.ctx.Err() != nil {
		return "", ErrClosed
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b[:])
	m, _ := json.Marshal(meta{Created: s.cfg.Now().UTC(), Size: size})
	sizeVal := []byte(fmt.Sprint(size))
	if tx, ok := s.st.(store.Transactor); ok {
		_, err := tx.Txn(ctx,
			store.Op{Kind: store.OpPut, Key: s.metaKey(token), Value: m, IfAbsent: true},
			store.Op{Kind: store.OpPut, Key: s.sizeKey(token), Value: sizeVal, IfAbsent: true})
		if err != nil {
			return "", fmt.Errorf("v2: create token: %w", err)
		}
	} else {
		// The meta record goes first: a token is visible only once both
		// exist, and collection only deletes what has a meta record.
		if _, err := s.st.Create(ctx, s.metaKey(token), m); err != nil {
			return "", fmt.Errorf("v2: create token: %w", err)
		}
		if _, err := s.st.Create(ctx, s.sizeKey(token), sizeVal); err != nil {
			_, _ = s.st.Delete(context.WithoutCancel(ctx), s.metaKey(token))
			return "", fmt.Errorf("v2: create token: %w", err)
		}
	}
	s.lg.Info("discovery token created", "token", token, "size", size)
	return token, nil
}

// TokenURL is the discovery URL of a token: BaseURL/token.
func (s *Service) TokenURL(token string) string { return s.cfg.BaseURL + "/" + token }

// RemoveToken deletes a token and its registrations. The token disappears
// at once (its meta record goes first); members waiting on it get 404.
func (s *Service) RemoveToken(ctx context.Context, token string) error {
	if err := bootstrap.ValidateToken(token); err != nil {
		return err
	}
	kvs, _, err := s.st.List(ctx, s.tokenPrefix(token))
	if err != nil {
		return fmt.Errorf("v2: remove token: %w", err)
	}
	if len(kvs) == 0 {
		return fmt.Errorf("%w: %q", ErrTokenNotFound, token)
	}
	return s.deleteToken(ctx, token, kvs)
}

func (s *Service) deleteToken(ctx context.Context, token string, kvs []store.KeyValue) error {
	metaKey := s.metaKey(token)
	if _, err := s.st.Delete(ctx, metaKey); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("v2: remove token %s: %w", token, err)
	}
	var errs []error
	for _, kv := range kvs {
		if kv.Key == metaKey {
			continue
		}
		if _, err := s.st.Delete(ctx, kv.Key); err != nil && !errors.Is(err, store.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("v2: remove token %s (it is already invisible; the next collection retries): %w", token, err)
	}
	return nil
}

// CollectGarbage deletes every expired token, and the leftovers of tokens
// whose removal was interrupted, and returns how many tokens it deleted.
func (s *Service) CollectGarbage(ctx context.Context) (int, error) {
	kvs, _, err := s.st.List(ctx, s.cfg.Prefix+"tokens/")
	if err != nil {
		return 0, fmt.Errorf("v2: collect expired tokens: %w", err)
	}
	byToken := make(map[string][]store.KeyValue)
	var order []string
	for _, kv := range kvs {
		rest := strings.TrimPrefix(kv.Key, s.cfg.Prefix+"tokens/")
		token, _, _ := strings.Cut(rest, "/")
		if _, ok := byToken[token]; !ok {
			order = append(order, token)
		}
		byToken[token] = append(byToken[token], kv)
	}
	deleted := 0
	var errs []error
	for _, token := range order {
		group := byToken[token]
		reason := "orphaned"
		for _, kv := range group {
			if kv.Key == s.metaKey(token) {
				reason = ""
				if m, ok := decodeMeta(kv.Value); !ok || s.expired(m) {
					reason = "expired"
				}
			}
		}
		if reason == "" {
			continue
		}
		if err := s.deleteToken(ctx, token, group); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted++
		s.lg.Info("discovery token deleted", "token", token, "reason", reason, "keys", len(group))
	}
	return deleted, errors.Join(errs...)
}

func decodeMeta(b []byte) (meta, bool) {
	var m meta
	if err := json.Unmarshal(b, &m); err != nil || m.Created.IsZero() {
		return meta{}, false
	}
	return m, true
}

func (s *Service) expired(m meta) bool { return s.cfg.Now().Sub(m.Created) >= s.cfg.MaxAge }

func (s *Service) gcLoop() {
	defer s.wg.Done()
	wait.Every(s.ctx, s.cfg.GCInterval, func() {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.GCInterval)
		if _, err := s.CollectGarbage(ctx); err != nil && s.ctx.Err() == nil {
			s.lg.Error("collecting expired discovery tokens failed; retrying at the next interval", "err", err)
		}
		cancel()
	})
}
