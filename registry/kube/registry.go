package kube

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/internal/defaults"
	"github.com/beaconplane/beacon/registry/internal/healthjoin"
	"golang.org/x/sync/errgroup"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func init() {
	registry.RegisterDriver(BackendName, func(ctx context.Context, dc registry.DriverConfig) (registry.Registry, error) {
		if dc.Registry.Root != "" {
			return nil, fmt.Errorf("%w: a key root (%q) does not apply to the %s backend, which stores no keys",
				ErrInvalidConfig, dc.Registry.Root, BackendName)
		}
		cfg := ConfigFromEnv(dc.Env())
		cfg.MaxMetadataSize = dc.Registry.MaxMetadataSize
		cfg.DrainGrace = dc.Registry.DrainGrace
		cfg.HealthPanicThreshold = dc.Registry.HealthPanicThreshold
		cfg.Logger, cfg.Metrics = dc.Registry.Logger, dc.Registry.Metrics
		if dc.Registry.Layout == registry.LayoutDynamo {
			return OpenDynamo(ctx, cfg) // DynamoWorkerMetadata resources, read-only
		}
		return Open(ctx, cfg)
	})
}

// BackendName is the name this registry is opened by
// (BEACON_DISCOVERY_BACKEND=kubernetes).
const BackendName = "kubernetes"

// RBAC names of the resources the registry uses (error messages, access
// checks).
const (
	instanceSetsResource   = Resource + "." + Group
	endpointSlicesResource = "endpointslices.discovery.k8s.io"
	podsResource           = "pods"
)

// Registry is the Kubernetes-native registry.Registry: instances are kept in
// InstanceSet custom resources (one per registering process, owned by its
// pod) and are live while their pod is Ready in an EndpointSlice labelled
// DiscoveryLabel. Create it with Open; Close it to delete its InstanceSet.
// It is safe for concurrent use; use one per process.
type Registry struct {
	cfg        Config
	kind       *objects // what it reads: InstanceSets, or DynamoWorkerMetadata
	log        *slog.Logger
	m          *metrics
	host       string
	namespaces []string // watched; [""] for every namespace

	dyn  dynamic.Interface
	http *http.Client // the dynamic client's: TLS, credentials

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	valid    *validCache
	panics   *healthjoin.Board // services entering and leaving health panic (health.go)
	collided collisions        // the dynamo layout's collisions reported

	noAccessCheck bool // tests: see the requests' own errors

	// readMu, viewMu, writerMu and stateMu each guard the field below
	// them alone: none is held while another is taken.
	readMu sync.Mutex
	readOK bool

	viewMu sync.Mutex
	view   *view

	writerMu sync.Mutex
	writer   *writer

	stateMu sync.Mutex
	state   registry.State
	states  chan registry.StateChange
}

var (
	_ registry.Registry   = (*Registry)(nil)
	_ registry.Registrar  = (*Registry)(nil)
	_ registry.Discoverer = (*Registry)(nil)
	_ registry.Getter     = (*Registry)(nil)
)

// Open connects to the API server and checks, within cfg.Timeout, that it
// answers and serves the InstanceSet resource: an unreachable server, bad
// credentials or a missing CRD give an error saying so. Access rights are
// checked when first needed: reader rights by the first List or Watch,
// writer rights and the pod identity by the first Register.
func Open(ctx context.Context, cfg Config) (*Registry, error) {
	return open(ctx, cfg, instanceSets)
}

// open opens a Registry that reads kind's objects.
func open(ctx context.Context, cfg Config, kind *objects) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.MaxMetadataSize = cmp.Or(cfg.MaxMetadataSize, beacon.DefaultMaxMetadataSize)
	cfg.HealthPanicThreshold = cmp.Or(cfg.HealthPanicThreshold, defaults.HealthPanicThreshold)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	rc, kubeNS, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("%w: metrics: %w", ErrInvalidConfig, err)
	}
	r := &Registry{
		cfg:    cfg,
		kind:   kind,
		log:    cfg.Logger.With("component", "registry", "backend", BackendName),
		m:      m,
		host:   rc.Host,
		valid:  newValidCache(),
		states: make(chan registry.StateChange, statesBuffer),
	}
	r.panics = healthjoin.NewBoard(r.log, m.healthPanics, cfg.HealthPanicThreshold)
	switch {
	case len(cfg.Namespaces) == 1 && cfg.Namespaces[0] == AllNamespaces:
		r.namespaces = []string{""}
	case len(cfg.Namespaces) > 0:
		r.namespaces = slices.Compact(slices.Sorted(slices.Values(cfg.Namespaces)))
	case cfg.Pod.Namespace != "":
		r.namespaces = []string{cfg.Pod.Namespace}
	default:
		if msgs := validation.IsDNS1123Label(kubeNS); len(msgs) > 0 {
			return nil, fmt.Errorf("%w: the kubeconfig context's namespace %q, which readers watch when neither %s nor %s "+
				"is set, is not a namespace name: %s", ErrInvalidConfig, kubeNS, EnvNamespaces, EnvPodNamespace, strings.Join(msgs, "; "))
		}
		r.namespaces = []string{kubeNS}
	}
	if r.http, err = rest.HTTPClientFor(rc); err == nil {
		r.dyn, err = dynamic.NewForConfigAndClient(rc, r.http)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: client for %s: %w", ErrInvalidConfig, rc.Host, err)
	}
	if err := r.probe(ctx); err != nil {
		return nil, err
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.ctx = withKlog(r.ctx, r.log) // every request's context derives from it
	return r, nil
}

// restConfig loads the client configuration and the default namespace.
func restConfig(cfg Config) (*rest.Config, string, error) {
	if cfg.REST != nil {
		rc := rest.CopyConfig(cfg.REST)
		tune(rc)
		return rc, "default", nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	switch files := filepath.SplitList(cfg.Kubeconfig); {
	case len(files) > 1:
		// KUBECONFIG's list of files, merged as kubectl merges them.
		rules.Precedence = files
	case cfg.Kubeconfig != "":
		rules.ExplicitPath = cfg.Kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		where := "the default kubeconfig (" + EnvKubeconfig + ", ~/.kube/config) or the in-cluster service account"
		if cfg.Kubeconfig != "" {
			where = "kubeconfig " + cfg.Kubeconfig
		}
		if clientcmd.IsEmptyConfig(err) {
			// client-go's own words advise KUBERNETES_MASTER, which is not
			// the way: say what is missing.
			if cfg.Kubeconfig != "" {
				return nil, "", fmt.Errorf("%w: kubeconfig %s names no cluster to use (no current-context, or its context names "+
					"no cluster with a server): set one with kubectl config use-context, or point %s at another file",
					ErrInvalidConfig, cfg.Kubeconfig, EnvKubeconfig)
			}
			_, inCluster := rest.InClusterConfig()
			return nil, "", fmt.Errorf("%w: no Kubernetes client configuration: no kubeconfig (%s unset or naming no cluster, "+
				"~/.kube/config absent), and not in a pod with a service account (%v): set %s (or kube.Config.Kubeconfig) outside a "+
				"cluster; in a pod, keep the service account token mounted (automountServiceAccountToken)",
				ErrInvalidConfig, EnvKubeconfig, inCluster, EnvKubeconfig)
		}
		return nil, "", fmt.Errorf("%w: no Kubernetes client configuration from %s: %w", ErrInvalidConfig, where, err)
	}
	ns, _, err := cc.Namespace()
	if err != nil || ns == "" {
		ns = "default"
	}
	tune(rc)
	return rc, ns, nil
}

// tune sets Beacon's client defaults: a user agent, and rate limits that
// do not throttle a burst of registrations or a re-list.
func tune(rc *rest.Config) {
	rc.UserAgent = cmp.Or(rc.UserAgent, "beacon ("+rest.DefaultKubernetesUserAgent()+")")
	rc.QPS = cmp.Or(rc.QPS, 50)
	rc.Burst = cmp.Or(rc.Burst, 100)
}

// probe checks that the API server answers and serves the registry's
// resource (InstanceSets, or DynamoWorkerMetadata).
func (r *Registry) probe(ctx context.Context) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	res, err := r.discoveryResources(ctx, start)
	if err != nil {
		return err
	}
	for _, a := range res.APIResources {
		if a.Name == r.kind.resource {
			return nil
		}
	}
	return r.kind.notInstalled
}

// discoveryResources reads the API server's resources of the registry's
// group version; start is when the caller began waiting (for the error's bound,
// which ctx's deadline, the caller's or Config.Timeout, sets).
func (r *Registry) discoveryResources(ctx context.Context, start time.Time) (*metav1.APIResourceList, error) {
	var res metav1.APIResourceList
	err := r.rawGet(ctx, "/apis/"+r.kind.group+"/"+r.kind.version, &res)
	switch {
	case err == nil:
		return &res, nil
	case apierrors.IsNotFound(err):
		return nil, r.groupVersions(ctx)
	case ctx.Err() != nil && !isCertificateError(err):
		bound := r.cfg.Timeout
		if dl, ok := ctx.Deadline(); ok {
			bound = dl.Sub(start).Round(100 * time.Millisecond)
		}
		return nil, fmt.Errorf("%w at %s: no answer within %v: %w; check that the cluster is up and the kubeconfig (%s) "+
			"or in-cluster configuration points at it", ErrUnreachable, r.host, bound, context.Cause(ctx), EnvKubeconfig)
	}
	return nil, r.explain(op{verb: "discover", resource: r.kind.rbacName()}, err)
}

// groupVersions tells, once the API server does not serve the registry's
// group version, whether the group is served at all: a CRD of another
// version is not the same as none.
func (r *Registry) groupVersions(ctx context.Context) error {
	var g metav1.APIGroup
	if err := r.rawGet(ctx, "/apis/"+r.kind.group, &g); err != nil || len(g.Versions) == 0 {
		return r.kind.notInstalled
	}
	var served []string
	for _, v := range g.Versions {
		served = append(served, v.Version)
	}
	return fmt.Errorf("%w: the API server serves %s in version %s, and this Beacon uses %s %s",
		r.kind.mismatch, r.kind.group, strings.Join(served, ", "), r.kind.kind, r.kind.version)
}

// Ping checks that the API server answers, still serves the registry's
// resource (InstanceSets, or DynamoWorkerMetadata), and lets this client
// read what List and Watch read in every watched namespace (beacon serve's
// /readyz): a reader denied one of them would otherwise be ready while
// every read fails. A granted check is not repeated.
func (r *Registry) Ping(ctx context.Context) error {
	if r.closed.Load() {
		return registry.ErrClosed
	}
	if err := r.probe(ctx); err != nil {
		return err
	}
	return r.checkReader(ctx)
}

// Namespaces returns the Kubernetes namespaces List and Watch see ("" means
// every namespace).
func (r *Registry) Namespaces() []string { return slices.Clone(r.namespaces) }

// Host returns the API server's URL.
func (r *Registry) Host() string { return r.host }

// Close ends every watch and deletes this process's InstanceSet (if it
// registered anything), so that watchers see its instances go at once,
// within Config.Timeout. It is idempotent.
func (r *Registry) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		r.writerMu.Lock()
		w := r.writer
		r.writerMu.Unlock()
		if w != nil {
			r.closeErr = w.close()
		}
		r.viewMu.Lock()
		v := r.view
		r.viewMu.Unlock()
		if v != nil {
			v.fail(registry.ErrClosed)
		}
		r.cancel()
		r.wg.Wait()
		r.transition(registry.StateClosed, nil, 0)
	})
	return r.closeErr
}

// ObjectName returns the name of the InstanceSet this process writes (the
// pod's name, or pod.container), or "" without a pod identity.
func (r *Registry) ObjectName() string {
	if r.cfg.Pod.Name == "" {
		return ""
	}
	return r.cfg.Pod.resourceName()
}

// List implements registry.Discoverer: the live instances q selects in the
// watched namespaces, read from the API server (not a cache), with the
// largest resourceVersion of the two listings as the revision.
func (r *Registry) List(ctx context.Context, q beacon.Query) ([]beacon.Instance, int64, error) {
	if err := q.Validate(); err != nil {
		return nil, 0, err
	}
	if r.closed.Load() {
		return nil, 0, registry.ErrClosed
	}
	if err := r.checkReader(ctx); err != nil {
		return nil, 0, err
	}
	var (
		mu      sync.Mutex
		sets    []*setInfo
		ready   = map[string]bool{}
		maxRV   int64
		g, gctx = errgroup.WithContext(ctx)
	)
	for _, ns := range r.namespaces {
		g.Go(func() error {
			list, err := r.dyn.Resource(r.kind.gvr()).Namespace(ns).List(gctx, metav1.ListOptions{})
			if err != nil {
				return r.explain(op{"list", r.kind.rbacName(), ns}, err)
			}
			var parsed []*setInfo
			present := make(map[string]bool, len(list.Items))
			for i := range list.Items {
				present[string(list.Items[i].GetUID())] = true
				if s := r.parseSet(&list.Items[i]); s != nil {
					parsed = append(parsed, s)
				}
			}
			if list.GetContinue() == "" {
				r.valid.retain(ns, present)
			}
			mu.Lock()
			defer mu.Unlock()
			sets = append(sets, parsed...)
			maxRV = max(maxRV, parseRV(list.GetResourceVersion()))
			return nil
		})
		g.Go(func() error {
			list, rv, err := r.listSlices(gctx, ns, r.kind.slices)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range list {
				for pod := range readyPods(s) {
					ready[pod] = true
				}
			}
			maxRV = max(maxRV, parseRV(rv))
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, unavailable(err)
	}
	isReady := func(pod string) bool { return ready[pod] }
	live := r.joinHealth(r.liveInstances(sets, isReady), sets, isReady)
	out := make([]beacon.Instance, 0, len(live))
	for _, in := range live {
		if q.Matches(in.Ref()) {
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b beacon.Instance) int { return cmp.Compare(refKey(a.Ref()), refKey(b.Ref())) })
	return out, max(maxRV, 1), nil
}

// Get implements registry.Getter by listing ref's endpoint (its
// EndpointSlices and InstanceSets are read whole).
func (r *Registry) Get(ctx context.Context, ref beacon.Ref) (beacon.Instance, error) {
	return registry.GetByList(ctx, r, ref)
}

// discoverySelector selects the EndpointSlices of discovery-enabled
// Services.
const discoverySelector = DiscoveryLabel + "=" + DiscoveryLabelValue

// endpointReady reports whether an endpoint's pod is Ready: ready, and,
// where the slice says so, serving and not terminating. A Service with
// publishNotReadyAddresses gets slices whose ready is always true; their
// serving condition is the pod's readiness. A nil condition means true
// (the EndpointSlice API's rule).
func endpointReady(c discoveryv1.EndpointConditions) bool {
	return (c.Ready == nil || *c.Ready) && (c.Serving == nil || *c.Serving) && (c.Terminating == nil || !*c.Terminating)
}

// readyPods returns the pods a slice lists as Ready (endpointReady), as
// podKeys in the slice's namespace. An endpoint without a Pod targetRef,
// or whose targetRef names another namespace, is ignored: a slice speaks
// only for the pods of its own namespace.
func readyPods(s *discoveryv1.EndpointSlice) map[string]bool {
	out := map[string]bool{}
	for _, e := range s.Endpoints {
		if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || e.TargetRef.UID == "" {
			continue
		}
		if e.TargetRef.Namespace != "" && e.TargetRef.Namespace != s.Namespace {
			continue
		}
		if !endpointReady(e.Conditions) {
			continue
		}
		out[podKey(s.Namespace, string(e.TargetRef.UID))] = true
	}
	return out
}

// opContext bounds one request the registry makes on its own behalf.
func (r *Registry) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, r.cfg.Timeout)
}

// newHolder returns a random process incarnation ID.
func newHolder() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	host, _ := os.Hostname()
	if len(host) > 32 {
		host = host[:32]
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
