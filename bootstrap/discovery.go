package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/etcdwatch"
	"github.com/beaconplane/beacon/internal/wait"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Progress is a snapshot of a Join or GetCluster in flight, given to the
// WithProgress callback whenever it changes.
type Progress struct {
	Token string
	// Size is the cluster size (0 until the size key has been read).
	Size int
	// Registered is how many of the Size slots are taken.
	Registered int
	// Members are the registered members that form the cluster so far,
	// in registration order (at most Size).
	Members []Member
	// Err, when set, is the failure to reach the discovery service that
	// is about to be retried after RetryIn; Attempt counts the failures
	// in a row.
	Err     error
	RetryIn time.Duration
	Attempt int
}

// String renders the progress for humans, e.g. "2 of 3 members registered
// (infra1, infra2)".
func (p Progress) String() string {
	if p.Err != nil {
		return fmt.Sprintf("discovery service unreachable (attempt %d): %v; retrying in %v",
			p.Attempt, p.Err, p.RetryIn.Round(time.Millisecond))
	}
	if len(p.Members) == 0 {
		return fmt.Sprintf("0 of %d members registered", p.Size)
	}
	names := make([]string, len(p.Members))
	for i, m := range p.Members {
		names[i] = m.Name
	}
	return fmt.Sprintf("%d of %d members registered (%s)", p.Registered, p.Size, strings.Join(names, ", "))
}

// Option modifies one Join or GetCluster call.
type Option func(*callOptions)

type callOptions struct {
	progress func(Progress)
}

// WithProgress calls fn, from the calling goroutine, each time the number
// of registered members changes and before each retry. fn must not block
// for long.
func WithProgress(fn func(Progress)) Option {
	return func(o *callOptions) { o.progress = fn }
}

// Join registers a member under cfg.Token and waits until the cluster is
// full, as etcd's v3 discovery does at bootstrap, and returns the cluster:
// start the member's etcd with Cluster.InitialCluster as its initial
// cluster and Cluster.Token as its initial cluster token, and the member
// IDs etcd computes will be the IDs registered.
//
// The registration is the key MembersPrefix/<MemberID(peerURLs, token)>
// with the value MemberValue(name, peerURLs), written with the claim of the
// name (NameKey) in one transaction that fails if another member holds
// either. A member that joins again with the same name and peer URLs
// (after a restart) keeps its place.
//
// Join fails at once with ErrSizeNotFound or ErrBadSizeKey, with
// ErrFullCluster if Size members registered before it, with
// ErrDuplicateName or ErrDuplicateURL if another member already claims the
// name or a peer URL, and with ErrAccessDenied on bad credentials. It
// retries anything else (an unreachable service, a lost watch, a
// compacted revision) with capped exponential backoff until ctx ends; give
// ctx a deadline to bound the wait.
func Join(ctx context.Context, cfg Config, name string, peerURLs []string, opts ...Option) (Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return Cluster{}, err
	}
	if err := ValidateName(name); err != nil {
		return Cluster{}, err
	}
	urls, err := CanonicalPeerURLs(peerURLs)
	if err != nil {
		return Cluster{}, err
	}
	self := MemberKey(cfg.Token, memberID(urls, cfg.Token))
	value := memberValue(name, urls)

	d := newDiscovery(cfg, opts)
	defer d.close()
	if err := d.list(ctx); err != nil {
		return Cluster{}, err
	}
	if i := d.reg.index(self); i < 0 || d.reg.members[i].Value != value {
		if i < 0 && d.reg.full() {
			return Cluster{}, d.fullError(name)
		}
		if err := d.reg.conflict(self, name, urls); err != nil {
			return Cluster{}, err
		}
		if err := d.register(ctx, self, name, value); err != nil {
			return Cluster{}, err
		}
		// Read again, as etcd does: a watch must start after the current
		// revision to be served at once; one that starts in the past (before
		// the put) waits for etcd's 100 ms catch-up loop.
		if err := d.list(ctx); err != nil {
			return Cluster{}, err
		}
	}
	if err := d.wait(ctx, self, name, value); err != nil {
		return Cluster{}, err
	}
	if i := d.reg.index(self); i < 0 || i >= d.reg.size {
		return Cluster{}, d.fullError(name)
	}
	return d.reg.status().Cluster()
}

// GetCluster reads the cluster of cfg.Token without registering: it waits
// until the first Size members have registered (bounded by ctx) and
// returns them, also when more registered later (etcd's GetCluster, which
// proxies use to find a cluster that is already full). Errors are those of
// Join, except ErrFullCluster.
func GetCluster(ctx context.Context, cfg Config, opts ...Option) (Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return Cluster{}, err
	}
	d := newDiscovery(cfg, opts)
	defer d.close()
	if err := d.list(ctx); err != nil {
		return Cluster{}, err
	}
	if err := d.wait(ctx, "", "", ""); err != nil {
		return Cluster{}, err
	}
	return d.reg.status().Cluster()
}

// discovery is one Join or GetCluster call.
type discovery struct {
	cfg      Config
	lg       *slog.Logger
	cli      *clientv3.Client
	ownCli   bool
	progress func(Progress)
	reg      *registry
	failures int // consecutive failures to reach the service
	reported struct{ size, registered int }
	warned   map[string]bool // skipped keys already logged
}

func newDiscovery(cfg Config, opts []Option) *discovery {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	return &discovery{
		cfg:      cfg,
		lg:       cfg.logger().With("discovery-token", cfg.Token),
		cli:      cfg.Client,
		progress: o.progress,
		reg:      newRegistry(cfg.Token),
		warned:   make(map[string]bool),
	}
}

func (d *discovery) close() {
	if d.ownCli && d.cli != nil {
		_ = d.cli.Close()
	}
}

// client dials the service on first use (dialing can fail when
// credentials are set, since the client then authenticates at once).
func (d *discovery) client() (*clientv3.Client, error) {
	if d.cli != nil {
		return d.cli, nil
	}
	cc, err := d.cfg.ClientConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(d.cfg.Endpoints, ","), err)
	}
	d.cli, d.ownCli = cli, true
	return cli, nil
}

// list re-reads the token's registry (size key and members, one
// consistent read), retrying until it succeeds, fails permanently or ctx
// ends.
func (d *discovery) list(ctx context.Context) error {
	return d.retry(ctx, "cluster status check", func(ctx context.Context) error {
		cli, err := d.client()
		if err != nil {
			return err
		}
		reg, err := readRegistry(ctx, cli, d.cfg.Token, d.cfg.requestTimeout())
		if err != nil {
			return err
		}
		d.reg = reg
		for _, s := range reg.skipped {
			if !d.warned[s.Key] {
				d.warned[s.Key] = true
				d.lg.Warn("skipped a member registration", "reason", s.Reason, "memberKey", s.Key, "memberInfo", s.Value)
			}
		}
		return reg.sizeErr
	})
}

// readRegistry reads a token's size key and registrations at one revision.
func readRegistry(ctx context.Context, cli *clientv3.Client, token string, timeout time.Duration) (*registry, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := cli.Get(rctx, TokenPrefix(token), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	reg := newRegistry(token)
	reg.rev = resp.Header.Revision
	sizeKey, members := SizeKey(token), MembersPrefix(token)
	sizeSeen := false
	for _, kv := range resp.Kvs {
		switch key := string(kv.Key); {
		case key == sizeKey:
			reg.setSize(kv.Value, true)
			sizeSeen = true
		case strings.HasPrefix(key, members):
			reg.put(key, string(kv.Value), kv.CreateRevision)
		}
	}
	if !sizeSeen {
		reg.setSize(nil, false)
	}
	return reg, nil
}

// register writes the member's registration, and the claim of its name
// (NameKey), in one transaction that succeeds only if neither is held by
// another member: a registration under the same key (the same peer URLs)
// with another name is refused with ErrDuplicateURL, a name claimed by
// another registered member with ErrDuplicateName. Two members racing for
// one key or one name cannot both register. A registration with this
// member's name (a restart) is written again with a plain put, which keeps
// its create revision and so its place. It records the registration
// locally.
func (d *discovery) register(ctx context.Context, key, name, value string) error {
	return d.retry(ctx, "register member itself", func(ctx context.Context) error {
		cli, err := d.client()
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, d.cfg.requestTimeout())
		defer cancel()
		createRev, err := claim(rctx, cli, d.cfg.Token, key, name, value)
		if err != nil {
			return err
		}
		d.reg.put(key, value, createRev)
		d.lg.Debug("registered member itself", "memberKey", key, "memberInfo", value)
		return nil
	})
}

// maxClaimRounds bounds the compare-and-swap rounds of one claim; each
// lost round means another writer changed the keys in between.
const maxClaimRounds = 8

// claim registers the member (see register) and returns the registration's
// create revision.
func claim(ctx context.Context, cli *clientv3.Client, token, key, name, value string) (int64, error) {
	nameKey := NameKey(token, name)
	id := key[strings.LastIndexByte(key, '/')+1:]
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(nameKey), "=", 0),
	}
	ops := []clientv3.Op{clientv3.OpPut(key, value), clientv3.OpPut(nameKey, id)}
	createRev := int64(0) // 0: the put creates the key
	for range maxClaimRounds {
		resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).
			Else(clientv3.OpGet(key), clientv3.OpGet(nameKey)).Commit()
		if err != nil {
			return 0, err
		}
		if resp.Succeeded {
			if createRev == 0 {
				createRev = resp.Header.Revision
			}
			return createRev, nil
		}
		// Someone holds the key or the name: find out who, and try
		// again on exactly what was read.
		cmps, ops, createRev = cmps[:0], ops[:0], 0
		mine, claimed := firstKV(resp.Responses[0]), firstKV(resp.Responses[1])
		if mine != nil {
			other, _ := memberFromKV(token, key, string(mine.Value), mine.CreateRevision)
			if other.Name != name {
				return 0, fmt.Errorf("%w: %s is already registered under token %q by member %q (%s = %s): "+
					"two members cannot share peer URLs; fix --initial-advertise-peer-urls",
					ErrDuplicateURL, strings.Join(urlsOf(value), ","), token, shorten(other.Name), key, shorten(other.Value))
			}
			// This member, registered before (a restart).
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", mine.ModRevision))
			createRev = mine.CreateRevision
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
		}
		ops = append(ops, clientv3.OpPut(key, value))
		switch {
		case claimed == nil:
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(nameKey), "=", 0))
			ops = append(ops, clientv3.OpPut(nameKey, id))
		case string(claimed.Value) == id:
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(nameKey), "=", claimed.ModRevision))
		default:
			// Claimed by another member: refused while that member is
			// registered; a claim whose registration was deleted is stale.
			holder := MembersPrefix(token) + "/" + string(claimed.Value)
			if _, err := ParseID(string(claimed.Value)); err == nil {
				get, err := cli.Get(ctx, holder)
				if err != nil {
					return 0, err
				}
				if len(get.Kvs) > 0 {
					return 0, fmt.Errorf("%w: member %q is already registered under token %q as %s (%s); give each member its own name",
						ErrDuplicateName, shorten(name), token, holder, shorten(string(get.Kvs[0].Value)))
				}
			}
			cmps = append(cmps,
				clientv3.Compare(clientv3.ModRevision(nameKey), "=", claimed.ModRevision),
				clientv3.Compare(clientv3.CreateRevision(holder), "=", 0))
			ops = append(ops, clientv3.OpPut(nameKey, id))
		}
	}
	return 0, fmt.Errorf("bootstrap: register %s: the registry changed under each of %d attempts", key, maxClaimRounds)
}

func firstKV(r *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	if rng := r.GetResponseRange(); rng != nil && len(rng.Kvs) > 0 {
		return rng.Kvs[0]
	}
	return nil
}

// urlsOf returns the peer URLs of a registration value.
func urlsOf(value string) []string {
	_, urls, _ := ParseMemberValue(value)
	return urls
}

var (
	errWatchSilent = errors.New("bootstrap: the discovery service's watch is silent (no event, no progress notification)")
	errRelist      = errors.New("bootstrap: registry changed under the watch; re-listing")
	errSelfRemoved = errors.New("bootstrap: this member's registration was deleted; registering again")
)

// wait keeps the registry up to date until it is full. self, when set, is
// this member's key: if it disappears (deleted by hand), wait registers it
// again with value.
func (d *discovery) wait(ctx context.Context, self, name, value string) error {
	for {
		d.report()
		if d.reg.full() {
			return nil
		}
		err := d.watch(ctx, self)
		switch {
		case err == nil:
			d.report()
			return nil
		case ctx.Err() != nil:
			return d.waitError(ctx)
		case errors.Is(err, errRelist), errors.Is(err, errSelfRemoved):
			// The size key changed or was deleted, or history was
			// compacted: re-read the registry at once.
		default:
			// The watch failed (lost leader, lost connection): back off,
			// then re-read the registry.
			if err := d.backoff(ctx, "waiting for peers", err); err != nil {
				return err
			}
		}
		if err := d.list(ctx); err != nil {
			return err
		}
		if self != "" && d.reg.index(self) < 0 && !d.reg.full() {
			if err := d.register(ctx, self, name, value); err != nil {
				return err
			}
			if err := d.list(ctx); err != nil {
				return err
			}
		}
	}
}

// watch applies registry changes from the revision after the last read
// until the registry is full (nil), the registry must be re-read
// (errRelist, errSelfRemoved) or the watch fails.
//
// The wait can last long, so the watch does not trust a quiet stream
// (internal/etcdwatch): once it has heard nothing for half the request
// timeout it asks its member for a progress notification (on this watch's
// own gRPC stream; a watch ahead of a quiet service's revision is opened
// again from the revision etcd last reported, so that etcd answers), and
// when it still hears nothing after the whole request timeout (a hung or
// cut-off member, a dead connection) it fails with errWatchSilent, within
// 1.25 request timeouts, and the registry is read again after the backoff.
func (d *discovery) watch(ctx context.Context, self string) error {
	cli, err := d.client()
	if err != nil {
		return err
	}
	token := d.cfg.Token
	err = etcdwatch.Run(clientv3.WithRequireLeader(ctx), etcdwatch.Config{
		Client:    cli,
		Key:       TokenPrefix(token),
		Options:   []clientv3.OpOption{clientv3.WithPrefix()},
		Silence:   d.cfg.requestTimeout(),
		StreamKey: "beacon-discovery-watch",
		Deliver: func(_ context.Context, header int64, evs []*clientv3.Event) error {
			return d.apply(self, header, evs)
		},
	}, d.reg.rev+1)
	var (
		ce *etcdwatch.CompactedError
		se *etcdwatch.SilentError
	)
	switch {
	case errors.Is(err, errFull):
		return nil
	case err == nil || ctx.Err() != nil:
		return ctx.Err()
	case errors.As(err, &ce):
		d.lg.Warn("discovery registry history compacted while waiting; re-listing", "compactRevision", ce.CompactRevision)
		return errRelist
	case errors.As(err, &se):
		return fmt.Errorf("%w: nothing from %s for %v", errWatchSilent, d.endpoints(), se.Quiet.Round(time.Millisecond))
	case errors.Is(err, etcdwatch.ErrClientClosed):
		return errors.New("bootstrap: watch closed by the client")
	case errors.Is(err, errRelist), errors.Is(err, errSelfRemoved):
		return err
	}
	return fmt.Errorf("watch %s: %w", TokenPrefix(token), err)
}

// errFull ends the watch: the registry is full.
var errFull = errors.New("bootstrap: registry full")

// apply applies one watch response's events to the registry.
func (d *discovery) apply(self string, header int64, evs []*clientv3.Event) error {
	sizeKey, members := SizeKey(d.cfg.Token), MembersPrefix(d.cfg.Token)
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		switch {
		case key == sizeKey:
			return errRelist
		case !strings.HasPrefix(key, members):
		case ev.Type == mvccpb.DELETE:
			d.reg.remove(key)
			if key == self {
				return errSelfRemoved
			}
		default:
			d.reg.put(key, string(ev.Kv.Value), ev.Kv.CreateRevision)
			if i := len(d.reg.skipped) - 1; i >= 0 && d.reg.skipped[i].Key == key && !d.warned[key] {
				d.warned[key] = true
				d.lg.Warn("skipped a member registration", "reason", d.reg.skipped[i].Reason, "memberKey", key, "memberInfo", d.reg.skipped[i].Value)
			}
		}
	}
	d.reg.rev = max(d.reg.rev, header)
	if d.reg.full() {
		return errFull
	}
	d.report()
	return nil
}

// retry runs op until it succeeds; it returns at once on permanent errors
// and when ctx ends.
func (d *discovery) retry(ctx context.Context, step string, op func(context.Context) error) error {
	var last error // the last failure, explained
	for {
		err := op(ctx)
		if err == nil {
			d.failures = 0
			return nil
		}
		if ctx.Err() != nil {
			if last == nil {
				last = err
			}
			return d.unavailable(ctx, last) // what the attempts found, not the deadline
		}
		if perr := permanent(err); perr != nil {
			return perr
		}
		err = d.explain(ctx, err)
		last = err
		if err := d.backoff(ctx, step, err); err != nil {
			return err
		}
	}
}

// probeTimeout bounds the connection check of one discovery endpoint.
const probeTimeout = time.Second

// explain adds to a request that timed out what a connection to each
// endpoint finds (the etcd client only reports the deadline): a refused
// connection, an unknown host, no route. Endpoints that accept
// connections are not mentioned.
func (d *discovery) explain(ctx context.Context, err error) error {
	if d.cfg.Client != nil || !(errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded ||
		status.Code(err) == codes.Unavailable) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	found := make([]string, len(d.cfg.Endpoints))
	var wg sync.WaitGroup
	for i, ep := range d.cfg.Endpoints {
		host := ep
		if u, perr := url.Parse(ep); perr == nil && u.Host != "" {
			host = u.Host
		}
		wg.Go(func() {
			var dl net.Dialer
			conn, derr := dl.DialContext(ctx, "tcp", host)
			if derr != nil {
				var oe *net.OpError
				if errors.As(derr, &oe) && oe.Err != nil {
					derr = oe.Err
				}
				found[i] = fmt.Sprintf("%s: %v (is the discovery service running there, and is that its client port?)", host, derr)
				return
			}
			_ = conn.Close()
		})
	}
	wg.Wait()
	found = slices.DeleteFunc(found, func(s string) bool { return s == "" })
	if len(found) == 0 {
		return err
	}
	return fmt.Errorf("%w; %s", err, strings.Join(found, "; "))
}

// backoff waits before the next attempt after a failure.
func (d *discovery) backoff(ctx context.Context, step string, cause error) error {
	d.failures++
	first, limit := d.cfg.backoff()
	delay := first
	for i := 1; i < d.failures && delay < limit; i++ {
		delay *= 2
	}
	delay = min(delay, limit)
	delay += time.Duration(rand.Int64N(int64(delay)/10 + 1))
	d.lg.Warn("retry connecting to discovery service", "reason", step, "backoff", delay, "attempt", d.failures, "err", cause)
	if d.progress != nil {
		p := d.snapshot()
		p.Err, p.RetryIn, p.Attempt = cause, delay, d.failures
		d.progress(p)
	}
	if wait.Sleep(ctx, delay) {
		return nil
	}
	return d.unavailable(ctx, cause)
}

// permanent returns the error to give up with, or nil to retry.
func permanent(err error) error {
	switch {
	case errors.Is(err, ErrSizeNotFound), errors.Is(err, ErrBadSizeKey), errors.Is(err, ErrInvalidConfig),
		errors.Is(err, ErrDuplicateName), errors.Is(err, ErrDuplicateURL):
		return err
	case errors.Is(err, rpctypes.ErrAuthNotEnabled):
		return nil
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(rpctypes.Error(err), &ee) {
		code = ee.Code()
	}
	if code == codes.Unauthenticated || code == codes.PermissionDenied ||
		errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrUserEmpty) {
		return fmt.Errorf("%w: %v (check the discovery user and password, and the role's permission on %s)",
			ErrAccessDenied, err, RegistryPrefix)
	}
	return nil
}

func (d *discovery) unavailable(ctx context.Context, last error) error {
	return fmt.Errorf("%w: %w after %d failed attempts to reach %s; last error: %v",
		ErrUnavailable, context.Cause(ctx), max(d.failures, 1), d.endpoints(), last)
}

func (d *discovery) waitError(ctx context.Context) error {
	p := d.snapshot()
	return fmt.Errorf("bootstrap: token %q: %w while waiting for peers: %s",
		d.cfg.Token, context.Cause(ctx), p.String())
}

func (d *discovery) fullError(name string) error {
	st := d.reg.status()
	names := make([]string, 0, st.Size)
	for _, m := range st.In() {
		names = append(names, m.Name)
	}
	return fmt.Errorf("%w: token %q already has its %d members (%s), so %q cannot join; "+
		"do not reuse a discovery token: create a new one with `beacon token new`, or add the member to the running cluster with `etcdctl member add`",
		ErrFullCluster, d.cfg.Token, st.Size, strings.Join(names, ", "), name)
}

func (d *discovery) endpoints() string {
	if d.cfg.Client != nil {
		return strings.Join(d.cfg.Client.Endpoints(), ",")
	}
	return strings.Join(d.cfg.Endpoints, ",")
}

func (d *discovery) snapshot() Progress {
	st := d.reg.status()
	return Progress{Token: d.cfg.Token, Size: st.Size, Registered: st.Registered(), Members: st.In()}
}

// report calls the progress callback when the count changed.
func (d *discovery) report() {
	p := d.snapshot()
	if p.Size == d.reported.size && p.Registered == d.reported.registered {
		return
	}
	d.reported.size, d.reported.registered = p.Size, p.Registered
	d.lg.Debug("discovery progress", "size", p.Size, "registered", p.Registered)
	if d.progress != nil {
		d.progress(p)
	}
}

// conflict reports another member that already claims the name or one of
// the peer URLs.
func (r *registry) conflict(self, name string, urls []string) error {
	for _, m := range r.members {
		if m.Key == self {
			// The same peer URLs: the same member restarting, or another
			// member that claims them.
			if m.Name != name {
				return fmt.Errorf("%w: %s is already registered under token %q by member %q (%s = %s): "+
					"two members cannot share peer URLs; fix --initial-advertise-peer-urls",
					ErrDuplicateURL, strings.Join(urls, ","), r.token, shorten(m.Name), m.Key, shorten(m.Value))
			}
			continue
		}
		if m.Name == name {
			return fmt.Errorf("%w: member %q is already registered under token %q as %s (%s); give each member its own name "+
				"(if this member's peer URLs changed since it registered, the token cannot be used any more: create a new one)",
				ErrDuplicateName, name, r.token, m.Key, shorten(m.Value))
		}
		theirs, err := types.NewURLs(m.PeerURLs)
		if err != nil {
			continue // not a valid registration; the initial cluster check reports it
		}
		for _, u := range theirs.StringSlice() {
			for _, mine := range urls {
				if u == mine {
					return fmt.Errorf("%w: %s is already registered under token %q by member %q (%s)",
						ErrDuplicateURL, mine, r.token, shorten(m.Name), m.Key)
				}
			}
		}
	}
	return nil
}
