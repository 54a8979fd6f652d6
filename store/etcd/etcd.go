package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/internal/minver"
	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
)

// Store is a store.Store over an etcd v3 cluster. Create it with Open (or
// NewFromClient); it is safe for concurrent use.
type Store struct {
	cli            *clientv3.Client
	owned          bool   // Close closes cli
	endpoints      string // for error messages
	requestTimeout time.Duration
	listPageSize   int64
	watchSilence   time.Duration // 0: watches do not check for silence
	prober         *prober       // nil: members are not probed
	direct         *directKV     // nil: transactions go through cli.KV (NewFromClient)

	closed      atomic.Bool
	mu          sync.Mutex      // orders wg.Add in Watch before wg.Wait in Close
	closeCtx    context.Context // done at Close: ends every watch
	closeCancel context.CancelFunc
	wg          sync.WaitGroup // watch goroutines and the watchdog
	once        sync.Once
	wd          watchdog // bounds calls without a deadline
}

var (
	_ store.Store       = (*Store)(nil)
	_ store.Compactor   = (*Store)(nil)
	_ store.Transactor  = (*Store)(nil)
	_ store.LocalReader = (*Store)(nil)
	_ store.Failover    = (*Store)(nil)
)

// MinServerVersion is the oldest etcd the store works with: Beacon asks
// etcd whether authentication is on (AuthStatus, which came with 3.5), and
// is tested against 3.5 and later only.
const MinServerVersion = "3.5.0"

// ErrServerTooOld reports a cluster older than MinServerVersion (Open).
var ErrServerTooOld = errors.New("etcd: server too old")

// reconnectBackoff replaces gRPC's default reconnect backoff (1 s growing
// to 120 s), so that a client finds a cluster that comes back within a
// second, not minutes: a registry session with a short lease (etcd's
// minimum is 2 s) must be back before its lease expires. An idle client of
// a dead cluster costs one connection attempt per second; the jitter
// spreads many clients' attempts.
var reconnectBackoff = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  250 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   time.Second,
	},
	MinConnectTimeout: 5 * time.Second,
})

// probeKey is the key Open reads to check that the cluster answers (the
// key `etcdctl endpoint health` reads).
const probeKey = "health"

// Open connects to the cluster of cfg and checks that it answers a
// linearizable read within cfg.DialTimeout (and before ctx ends), so that
// a wrong endpoint, a stopped cluster, bad credentials or bad TLS files give
// a clear error here rather than later. An unreachable cluster gives an
// error matching store.ErrUnavailable that names the endpoints.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	r, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	ccfg := clientv3.Config{
		Endpoints:   r.endpoints,
		DialTimeout: r.dialTimeout,
		Username:    cfg.Username,
		Password:    cfg.Password,
		// Keep-alive pings find a dead connection (a crashed member, a
		// dropped NAT entry) that would otherwise leave watches silent.
		// etcd refuses pings more often than every 5 s by default.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		DialOptions:          []grpc.DialOption{reconnectBackoff},
		Logger:               zapLogger(cfg.Logger),
	}
	var tlsCfg *tls.Config
	if r.tls {
		if tlsCfg, err = cfg.tlsConfig(); err != nil {
			return nil, err
		}
		ccfg.TLS = tlsCfg
	}
	if cfg.Configure != nil {
		cfg.Configure(&ccfg)
	}
	fail := func(err error) error { return dialError(ctx, cfg, r, tlsCfg, err) }
	dctx, cancel := context.WithTimeout(ctx, r.dialTimeout)
	defer cancel()
	// With authentication, clientv3.Open already authenticates (bounded by
	// DialTimeout); without, it does not touch the network.
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return nil, fail(err)
	}
	if _, err := cli.Get(dctx, probeKey, clientv3.WithCountOnly()); err != nil && !errors.Is(err, rpctypes.ErrPermissionDenied) {
		// Permission denied means the cluster answered: this user may
		// read only some keys, which is fine.
		_ = cli.Close()
		return nil, fail(err)
	}
	if err := checkVersion(dctx, cli); err != nil {
		_ = cli.Close()
		return nil, err
	}
	s := newStore(cli, true, r)
	s.direct = newDirectKV(cli, ccfg)
	if len(r.endpoints) > 1 && r.probeTimeout > 0 {
		log := cfg.Logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		s.prober = newProber(r.endpoints, ccfg, r.probeTimeout, cli.SetEndpoints, log.With("component", "etcd-store"))
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.prober.run(s.closeCtx.Done())
		}()
	}
	return s, nil
}

// dialError explains why Open failed and what to check.
func dialError(ctx context.Context, cfg Config, r resolved, tlsCfg *tls.Config, err error) error {
	eps := strings.Join(r.endpoints, ",")
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed):
		return fmt.Errorf("%w: etcd: authenticate as %q at %s: %w: check Username and Password (%s, %s)", store.ErrUnauthenticated, cfg.Username, eps, err, EnvUsername, EnvPassword)
	case errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrAuthOldRevision):
		return fmt.Errorf("%w: etcd: %s requires authentication: %w: set Username and Password (%s, %s)", store.ErrUnauthenticated, eps, err, EnvUsername, EnvPassword)
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("etcd: connect to %s: %w", eps, ctx.Err())
	}
	code := grpcCode(err)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || code == codes.Unavailable || code == codes.DeadlineExceeded {
		if ctx.Err() != nil { // the caller's deadline: no time left to look closer
			return fmt.Errorf("%w: etcd at %s did not answer before the caller's deadline: %w; check that etcd runs there and the endpoints (%s) are right",
				store.ErrUnavailable, eps, ctx.Err(), EnvEndpoints)
		}
		msg := fmt.Errorf("%w: etcd at %s did not answer within %v (DialTimeout): %w", store.ErrUnavailable, eps, r.dialTimeout, err)
		return fmt.Errorf("%w; %s", msg, diagnose(ctx, cfg, r, tlsCfg))
	}
	return fmt.Errorf("etcd: connect to %s: %w%s", eps, err, hint(err))
}

// FromClientOption modifies NewFromClient.
type FromClientOption func(*bool)

// CloseClient makes the Store own the client: Close closes it too.
func CloseClient() FromClientOption { return func(owned *bool) { *owned = true } }

// NewFromClient wraps a client the caller made and keeps owning: Close ends
// the Store's watches but does not close cli (unless CloseClient is given).
// Unary calls without a deadline get DefaultRequestTimeout.
func NewFromClient(cli *clientv3.Client, opts ...FromClientOption) *Store {
	owned := false
	for _, o := range opts {
		o(&owned)
	}
	return newStore(cli, owned, resolved{
		endpoints:      cli.Endpoints(),
		requestTimeout: DefaultRequestTimeout,
		listPageSize:   DefaultListPageSize,
		watchSilence:   DefaultWatchSilenceTimeout,
	})
}

func newStore(cli *clientv3.Client, owned bool, r resolved) *Store {
	eps := strings.Join(r.endpoints, ",")
	if eps == "" { // an in-process client (embedded etcd) has no endpoints
		eps = "the in-process etcd client"
	}
	s := &Store{
		cli:            cli,
		owned:          owned,
		endpoints:      eps,
		requestTimeout: r.requestTimeout,
		listPageSize:   r.listPageSize,
		watchSilence:   r.watchSilence,
	}
	s.closeCtx, s.closeCancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.wd.run(s.requestTimeout, s.closeCtx.Done())
	}()
	return s
}

// checkVersion refuses a cluster older than MinServerVersion, as the
// first member that answers its status reports it: fronting etcd 3.4, beacon
// serve said it was ready and answered every registry request 503
// (AuthStatus unimplemented). A member that does not answer, or does not
// let this user read its status, leaves the question to the next.
func checkVersion(ctx context.Context, cli *clientv3.Client) error {
	for _, ep := range cli.Endpoints() {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			continue
		}
		if !minver.AtLeast(st.Version, MinServerVersion) {
			return fmt.Errorf("%w: the member at %s runs etcd %s; Beacon needs etcd %s or later (it asks etcd whether authentication is on, which etcd 3.4 cannot answer): upgrade the cluster",
				ErrServerTooOld, ep, st.Version, MinServerVersion)
		}
		return nil
	}
	return nil
}

// Excluded returns the endpoints the store leaves out now because their
// members did not answer a probe while others did (see
// Config.ProbeTimeout), sorted; empty when every member is in use.
func (s *Store) Excluded() []string {
	if s.prober == nil {
		return nil
	}
	return s.prober.excluded()
}

// ExcludedChanged returns a channel closed at the next change of Excluded
// (nil, never closed, when members are not probed).
func (s *Store) ExcludedChanged() <-chan struct{} {
	if s.prober == nil {
		return nil
	}
	return s.prober.changes()
}

// Probed implements store.Failover: it has the store probe every member
// (one sweep at a time, at most one per ProbeTimeout) and returns a
// channel closed when that sweep has ended; closed at once with a single
// endpoint.
func (s *Store) Probed() <-chan struct{} {
	if s.prober == nil {
		return closedChan
	}
	return s.prober.suspect()
}

// closedChan is a channel closed from the start.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Client returns the etcd client, for callers that need etcd features the
// store contract does not offer (naming, bootstrap). It stays usable until
// Close if the Store made it.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Close ends every watch (their channels close) and every call still
// running without a deadline of its own, then closes the client if Open
// made it. It is idempotent; every later call fails with store.ErrClosed.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.closed.Store(true)
		s.closeCancel()
		s.mu.Unlock()
		s.wg.Wait()
		if s.owned {
			err = s.cli.Close()
			if errors.Is(err, context.Canceled) {
				err = nil
			}
		}
	})
	return err
}

// begin checks Close and gives a unary call its context: the caller's if
// it has a deadline, otherwise one the watchdog ends after RequestTimeout.
// The caller must pass tc to s.wd.end when the call returns.
func (s *Store) begin(ctx context.Context) (c context.Context, tc *timedCall, err error) {
	if s.closed.Load() {
		return nil, nil, store.ErrClosed
	}
	if s.cli.Ctx().Err() != nil {
		// Closed by its owner (NewFromClient). Fail now: clientv3 would
		// retry the call against the closed connection for seconds.
		return nil, nil, fmt.Errorf("%w: the etcd client was closed", store.ErrClosed)
	}
	if _, ok := ctx.Deadline(); ok {
		return ctx, nil, nil
	}
	c, tc = s.wd.begin(ctx)
	return c, tc, nil
}

// beginValid is begin for a call whose input was checked: invalid, the
// check's error, fails the call first, before anything else is checked.
func (s *Store) beginValid(ctx context.Context, invalid error) (context.Context, *timedCall, error) {
	if invalid != nil {
		return nil, nil, invalid
	}
	return s.begin(ctx)
}

func fromKV(kv *mvccpb.KeyValue) store.KeyValue {
	return fromKVKey(kv, string(kv.Key))
}

func fromKVKey(kv *mvccpb.KeyValue, key string) store.KeyValue {
	return store.KeyValue{
		Key:            key,
		Value:          kv.Value, // the response is ours alone: no copy
		CreateRevision: kv.CreateRevision,
		ModRevision:    kv.ModRevision,
		Lease:          store.LeaseID(kv.Lease),
	}
}

// nonNil makes an empty value read back as empty, not nil.
func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

// Get implements store.Reader. The read is linearizable.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	return s.get(ctx, key)
}

// GetLocal implements store.LocalReader with a serializable read: the
// member the call reaches answers from its own state, without a round trip
// through the leader.
func (s *Store) GetLocal(ctx context.Context, key string) (store.KeyValue, error) {
	return s.get(ctx, key, clientv3.WithSerializable())
}

func (s *Store) get(ctx context.Context, key string, opts ...clientv3.OpOption) (store.KeyValue, error) {
	c, tc, err := s.beginValid(ctx, store.ValidateKey(key))
	if err != nil {
		return store.KeyValue{}, err
	}
	defer s.wd.end(tc)
	resp, err := s.cli.Get(c, key, opts...)
	if err != nil {
		return store.KeyValue{}, s.wrap(ctx, c, fmt.Sprintf("get %q", key), err)
	}
	if len(resp.Kvs) == 0 {
		return store.KeyValue{}, fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	kv := fromKV(resp.Kvs[0])
	kv.Value = nonNil(kv.Value)
	return kv, nil
}

// List implements store.Reader. The first page is a linearizable read; the
// others read at its revision, so the result is one snapshot. If the
// snapshot is compacted between pages, List starts over (a few times).
func (s *Store) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	c, tc, err := s.beginValid(ctx, store.ValidatePrefix(prefix))
	if err != nil {
		return nil, 0, err
	}
	defer s.wd.end(tc)
	for attempt := 0; ; attempt++ {
		kvs, rev, err := s.list(c, prefix)
		if errors.Is(err, rpctypes.ErrCompacted) && attempt < 3 {
			continue
		}
		if err != nil {
			return nil, 0, s.wrap(ctx, c, fmt.Sprintf("list %q", prefix), err)
		}
		return kvs, rev, nil
	}
}

func (s *Store) list(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	// The range of the prefix; the empty prefix is the whole key space
	// ("\x00" to the end, as clientv3.WithPrefix does).
	key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	if prefix == "" {
		key, end = "\x00", "\x00"
	}
	var (
		out []store.KeyValue
		rev int64
	)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(s.listPageSize)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, key, opts...)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
			out = make([]store.KeyValue, 0, len(resp.Kvs))
		}
		// One string holds the page's keys and each key is a slice of
		// it: one allocation per page instead of one per key (values
		// are the response's own bytes already).
		n := 0
		for _, kv := range resp.Kvs {
			n += len(kv.Key)
		}
		buf := make([]byte, 0, n)
		for _, kv := range resp.Kvs {
			buf = append(buf, kv.Key...)
		}
		keys := string(buf)
		for _, kv := range resp.Kvs {
			out = append(out, fromKVKey(kv, keys[:len(kv.Key)]))
			keys = keys[len(kv.Key):]
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

func leaseOpts(o store.WriteOptions) []clientv3.OpOption {
	if o.KeepLease {
		return []clientv3.OpOption{clientv3.WithIgnoreLease()}
	}
	if o.Lease == store.NoLease {
		return nil
	}
	return []clientv3.OpOption{clientv3.WithLease(clientv3.LeaseID(o.Lease))}
}

// Create implements store.Writer with a transaction on the key's create
// revision.
func (s *Store) Create(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	c, tc, err := s.beginValid(ctx, store.ValidateWrite(key, value))
	if err != nil {
		return 0, err
	}
	defer s.wd.end(tc)
	resp, err := s.txnElseGet(ctx, c, "create", key,
		clientv3.OpPut(key, string(value), leaseOpts(store.ApplyWriteOptions(opts))...),
		clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		if kv := elseKV(resp); kv != nil {
			return 0, fmt.Errorf("%w: %q (created at revision %d)", store.ErrKeyExists, key, kv.CreateRevision)
		}
		return 0, fmt.Errorf("%w: %q", store.ErrKeyExists, key)
	}
	return resp.Header.Revision, nil
}

// Put implements store.Writer.
func (s *Store) Put(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	c, tc, err := s.beginValid(ctx, store.ValidateWrite(key, value))
	if err != nil {
		return 0, err
	}
	defer s.wd.end(tc)
	resp, err := s.cli.Put(c, key, string(value), leaseOpts(store.ApplyWriteOptions(opts))...)
	if err != nil {
		return 0, s.wrap(ctx, c, fmt.Sprintf("put %q", key), err)
	}
	return resp.Header.Revision, nil
}

// Update implements store.Writer with a transaction on the key's mod
// revision; when it fails, the same transaction reads the key to tell a
// conflict from an absent key.
func (s *Store) Update(ctx context.Context, key string, value []byte, modRevision int64, opts ...store.WriteOption) (int64, error) {
	c, tc, err := s.beginValid(ctx, store.ValidateWrite(key, value))
	if err != nil {
		return 0, err
	}
	defer s.wd.end(tc)
	resp, err := s.txnElseGet(ctx, c, "update", key,
		clientv3.OpPut(key, string(value), leaseOpts(store.ApplyWriteOptions(opts))...),
		casCompares(key, modRevision)...)
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, casError(key, modRevision, elseKV(resp))
	}
	return resp.Header.Revision, nil
}

// txnElseGet runs then on key if cmps hold; if they do not, the same
// transaction reads key (its revisions, not its value) for the caller's
// error to say why. An error names the call as verb and key.
func (s *Store) txnElseGet(parent, c context.Context, verb, key string, then clientv3.Op, cmps ...clientv3.Cmp) (*clientv3.TxnResponse, error) {
	resp, err := s.cli.Txn(c).If(cmps...).Then(then).Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return nil, s.wrap(parent, c, fmt.Sprintf("%s %q", verb, key), err)
	}
	return resp, nil
}

// casCompares is the precondition "key's ModRevision is rev". An absent key
// compares as ModRevision 0, so rev <= 0 also requires the key to exist.
func casCompares(key string, rev int64) []clientv3.Cmp {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", rev)}
	if rev <= 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), ">", 0))
	}
	return cmps
}

// elseKV returns the key read by a failed transaction's Else branch, or
// nil if it is absent.
func elseKV(resp *clientv3.TxnResponse) *mvccpb.KeyValue {
	for _, r := range resp.Responses {
		if rr := r.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			return rr.Kvs[0]
		}
	}
	return nil
}

func casError(key string, want int64, kv *mvccpb.KeyValue) error {
	if kv == nil {
		return fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	return fmt.Errorf("%w: %q was written at revision %d, not %d", store.ErrConflict, key, kv.ModRevision, want)
}

// Delete implements store.Writer. With store.IfModRevision it is a
// transaction like Update's.
func (s *Store) Delete(ctx context.Context, key string, opts ...store.DeleteOption) (int64, error) {
	o := store.ApplyDeleteOptions(opts)
	c, tc, err := s.beginValid(ctx, store.ValidateKey(key))
	if err != nil {
		return 0, err
	}
	defer s.wd.end(tc)
	if o.IfModRevision == 0 {
		resp, err := s.cli.Delete(c, key)
		if err != nil {
			return 0, s.wrap(ctx, c, fmt.Sprintf("delete %q", key), err)
		}
		if resp.Deleted == 0 {
			return 0, fmt.Errorf("%w: %q", store.ErrNotFound, key)
		}
		return resp.Header.Revision, nil
	}
	resp, err := s.txnElseGet(ctx, c, "delete", key, clientv3.OpDelete(key), casCompares(key, o.IfModRevision)...)
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, casError(key, o.IfModRevision, elseKV(resp))
	}
	return resp.Header.Revision, nil
}

// Txn implements store.Transactor with one etcd transaction: the
// preconditions are its compares, the ops its success branch, and its
// failure branch reads the conditioned keys to name the first that failed.
// etcd limits a transaction to --max-txn-ops operations (128 by default).
func (s *Store) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	c, tc, err := s.beginValid(ctx, store.ValidateOps(ops))
	if err != nil {
		return 0, err
	}
	defer s.wd.end(tc)
	// No Else branch: etcd would decode it with every transaction (twice:
	// the request and its raft entry) to use it only when a precondition
	// fails, which costs registrations about a seventh of etcd's CPU. The
	// rare failure reads the keys at the revision the transaction saw.
	var resp *clientv3.TxnResponse
	if s.direct != nil {
		resp, err = s.direct.txn(c, ops)
	} else {
		resp, err = txnThroughKV(c, s.cli, ops)
	}
	if err != nil {
		return 0, s.wrap(ctx, c, fmt.Sprintf("transaction of %d ops", len(ops)), err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	var conds []store.Op // the ops with a precondition
	for _, op := range ops {
		if op.IfAbsent || op.IfModRevision != 0 {
			conds = append(conds, op)
		}
	}
	reads := make([]clientv3.Op, len(conds))
	for i, op := range conds {
		reads[i] = clientv3.OpGet(op.Key, clientv3.WithKeysOnly(), clientv3.WithRev(resp.Header.Revision))
	}
	rresp, err := s.cli.Txn(c).Then(reads...).Commit()
	if errors.Is(err, rpctypes.ErrCompacted) {
		// Compacted in between (all but impossible): the keys as they are
		// now still name the conflict in all but a race.
		for i, op := range conds {
			reads[i] = clientv3.OpGet(op.Key, clientv3.WithKeysOnly())
		}
		rresp, err = s.cli.Txn(c).Then(reads...).Commit()
	}
	if err != nil {
		return 0, s.wrap(ctx, c, fmt.Sprintf("transaction of %d ops failed a precondition; reading which", len(ops)), err)
	}
	for i, op := range conds {
		var kv *mvccpb.KeyValue
		if rr := rresp.Responses[i].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			kv = rr.Kvs[0]
		}
		switch {
		case op.IfAbsent && kv != nil:
			return 0, &store.ConflictError{Key: op.Key, Err: store.ErrKeyExists}
		case op.IfModRevision != 0 && kv == nil:
			return 0, &store.ConflictError{Key: op.Key, Err: store.ErrNotFound}
		case op.IfModRevision != 0 && kv.ModRevision != op.IfModRevision:
			return 0, &store.ConflictError{Key: op.Key, Err: store.ErrConflict}
		}
	}
	// Unreachable unless the keys were read at another revision than the
	// compares (after a compaction): etcd evaluated them on this snapshot.
	return 0, &store.ConflictError{Key: conds[0].Key, Err: store.ErrConflict}
}

// txnThroughKV sends ops as txnWire does, through kv (the KV of a
// client from NewFromClient).
func txnThroughKV(c context.Context, kv clientv3.KV, ops []store.Op) (*clientv3.TxnResponse, error) {
	var (
		cmps []clientv3.Cmp
		then = make([]clientv3.Op, 0, len(ops))
	)
	for _, op := range ops {
		if op.IfAbsent {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(op.Key), "=", 0))
		}
		if op.IfModRevision != 0 {
			cmps = append(cmps, casCompares(op.Key, op.IfModRevision)...)
		}
		switch op.Kind {
		case store.OpPut:
			then = append(then, clientv3.OpPut(op.Key, string(op.Value), leaseOpts(store.WriteOptions{Lease: op.Lease})...))
		case store.OpDelete:
			then = append(then, clientv3.OpDelete(op.Key))
		}
	}
	return kv.Txn(c).If(cmps...).Then(then...).Commit()
}

// Compact implements store.Compactor. Watches from revisions below rev fail
// with store.ErrCompacted afterwards; compacting to a revision already
// compacted gives an error matching store.ErrCompacted.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	if rev <= 0 {
		return fmt.Errorf("etcd: cannot compact to revision %d: revisions start at 1", rev)
	}
	c, tc, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer s.wd.end(tc)
	_, err = s.cli.Compact(c, rev)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrFutureRev):
		return fmt.Errorf("etcd: cannot compact to revision %d: it is after the current revision", rev)
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: etcd compact: revision %d is already compacted", store.ErrCompacted, rev)
	}
	return s.wrap(ctx, c, fmt.Sprintf("compact to %d", rev), err)
}

// Grant implements store.Leaser. etcd leases have whole-second TTLs: ttl is
// rounded up, and etcd raises TTLs below its minimum (about 2 s with the
// default election timeout). The returned Lease has the TTL etcd granted.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (store.Lease, error) {
	c, tc, err := s.beginValid(ctx, store.ValidateTTL(ttl))
	if err != nil {
		return store.Lease{}, err
	}
	defer s.wd.end(tc)
	secs := int64((ttl + time.Second - 1) / time.Second)
	resp, err := s.cli.Grant(c, secs)
	if err == nil && resp.Error != "" {
		err = errors.New(resp.Error)
	}
	if err != nil {
		return store.Lease{}, s.wrap(ctx, c, fmt.Sprintf("grant lease of %ds", secs), err)
	}
	return store.Lease{ID: store.LeaseID(resp.ID), TTL: time.Duration(resp.TTL) * time.Second}, nil
}

// KeepAlive implements store.Leaser with one keep-alive round trip
// (clientv3's KeepAliveOnce). It deliberately does not use clientv3's
// KeepAlive stream: the caller (the registry's Session) owns the cadence,
// sees every failure, and decides when a lease is lost, instead of a
// background loop that renews silently and gives up on its own.
func (s *Store) KeepAlive(ctx context.Context, id store.LeaseID) (time.Duration, error) {
	c, tc, err := s.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer s.wd.end(tc)
	resp, err := s.cli.KeepAliveOnce(c, clientv3.LeaseID(id))
	if err != nil {
		return 0, s.wrap(ctx, c, fmt.Sprintf("keep-alive lease %x", int64(id)), err)
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// Revoke implements store.Leaser.
func (s *Store) Revoke(ctx context.Context, id store.LeaseID) error {
	c, tc, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer s.wd.end(tc)
	if _, err := s.cli.Revoke(c, clientv3.LeaseID(id)); err != nil {
		return s.wrap(ctx, c, fmt.Sprintf("revoke lease %x", int64(id)), err)
	}
	return nil
}
