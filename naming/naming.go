package naming

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/beaconplane/beacon/naming/internal/publish"
	"github.com/beaconplane/beacon/registry"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
)

// DefaultRetryMax caps the backoff between attempts to watch again after a
// registry watch ended with an error.
const DefaultRetryMax = 5 * time.Second

// retryFirst is the first backoff delay.
const retryFirst = 50 * time.Millisecond

// Builder is a grpc-go resolver.Builder for beacon:///namespace/component/endpoint
// targets over any registry.Discoverer (the store-backed registry over
// etcd, memory, file or NATS, or a Kubernetes registry). Pass it to
// grpc.NewClient with grpc.WithResolvers (or use DialOption); it is not
// registered globally. One Builder serves any number of channels and
// targets; it is safe for concurrent use.
type Builder struct {
	d        registry.Discoverer
	scheme   string
	log      *slog.Logger
	m        *publish.Metrics
	retryMax time.Duration
}

var (
	_ resolver.Builder            = (*Builder)(nil)
	_ resolver.AuthorityOverrider = (*Builder)(nil)
)

// Option configures a Builder.
type Option func(*options)

type options struct {
	scheme   string
	log      *slog.Logger
	metrics  prometheus.Registerer
	retryMax time.Duration
}

// WithScheme serves targets of another URL scheme than "beacon", for
// example to dial two registries from one program ("beacon-eu:///...").
// The scheme must be lower-case letters, digits, '+', '-' or '.', starting
// with a letter.
func WithScheme(scheme string) Option { return func(o *options) { o.scheme = scheme } }

// WithLogger sets the logger for watch trouble and skipped instances. Nil
// (the default) discards logs.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithMetrics registers the resolver metrics (beacon_naming_*) on reg. Nil
// (the default) exports none. Builders sharing a Registerer share the
// collectors.
func WithMetrics(reg prometheus.Registerer) Option { return func(o *options) { o.metrics = reg } }

// WithRetryMax caps the backoff between attempts to watch again after a
// registry watch ended with an error. Zero means DefaultRetryMax.
func WithRetryMax(d time.Duration) Option { return func(o *options) { o.retryMax = d } }

// NewBuilder returns a Builder whose resolvers follow d. It contacts
// nothing: every resolver starts its registry watch in the background.
func NewBuilder(d registry.Discoverer, opts ...Option) (*Builder, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: nil registry.Discoverer", ErrInvalidConfig)
	}
	o := options{scheme: Scheme}
	for _, opt := range opts {
		opt(&o)
	}
	if err := publish.CheckScheme(o.scheme); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if o.retryMax < 0 {
		return nil, fmt.Errorf("%w: retry max %v is negative; use 0 for the default (%v)", ErrInvalidConfig, o.retryMax, DefaultRetryMax)
	}
	o.retryMax = cmp.Or(o.retryMax, DefaultRetryMax)
	o.log = cmp.Or(o.log, slog.New(slog.DiscardHandler))
	m, err := publish.NewMetrics(o.metrics)
	if err != nil {
		return nil, fmt.Errorf("%w: metrics: %w", ErrInvalidConfig, err)
	}
	return &Builder{
		d:        d,
		scheme:   o.scheme,
		log:      o.log.With("component", "naming", "scheme", o.scheme),
		m:        m,
		retryMax: max(o.retryMax, retryFirst),
	}, nil
}

// DialOption returns grpc.WithResolvers(NewBuilder(d, opts...)), the
// option that lets grpc.NewClient dial beacon:/// targets.
func DialOption(d registry.Discoverer, opts ...Option) (grpc.DialOption, error) {
	b, err := NewBuilder(d, opts...)
	if err != nil {
		return nil, err
	}
	return b.DialOption(), nil
}

// DialOption returns grpc.WithResolvers(b).
func (b *Builder) DialOption() grpc.DialOption { return grpc.WithResolvers(b) }

// Scheme implements resolver.Builder.
func (b *Builder) Scheme() string { return b.scheme }

// OverrideAuthority implements resolver.AuthorityOverrider: the :authority
// of a channel to beacon:///ns/component/endpoint is the DNS name
// endpoint.component.ns (what a TLS certificate of the service can name),
// unless grpc.WithAuthority or the credentials set one.
func (b *Builder) OverrideAuthority(t resolver.Target) string {
	q, err := parseURL(b.scheme, &t.URL, t.URL.String())
	if err != nil {
		// Build will fail with the reason; any valid authority will do.
		return url.PathEscape(t.Endpoint())
	}
	return authority(q)
}

// Build implements resolver.Builder. It validates the target and starts
// the resolver's registry watch in the background; it never waits for the
// network. A malformed target gives an error matching ErrInvalidTarget, as
// does one whose names the registry's layout cannot hold: only a registry
// of the dynamo layout (registry.LayoutOf) serves the NVIDIA Dynamo
// runtime's names, Beacon's own holds its writers' DNS labels.
func (b *Builder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	raw := t.URL.String()
	q, err := parseURL(b.scheme, &t.URL, raw)
	if err != nil {
		return nil, err
	}
	if registry.LayoutOf(b.d) != registry.LayoutDynamo {
		if err := q.ValidateWritten(); err != nil {
			return nil, fmt.Errorf("%w %q: %w", ErrInvalidTarget, raw, err)
		}
	}
	return startResolver(b, q, raw, cc), nil
}
