package server

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3rpc"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// tokenSource gives the etcd token a client presents, and a fresh one when
// etcd refuses it as expired or outdated.
type tokenSource struct {
	// fetch gets a new token; nil for a fixed token (a bearer token a
	// client sent: when etcd refuses it, the client must authenticate
	// again).
	fetch func(ctx context.Context) (string, error)
	// maxAge is how long a fetched token is used before a new one is
	// fetched (half a JWT's lifetime); zero means until etcd refuses it.
	maxAge time.Duration

	mu      sync.Mutex
	tok     string
	fetched time.Time
}

func fixedToken(tok string) *tokenSource { return &tokenSource{tok: tok} }

// token returns the current token, fetching one when there is none or it
// is too old.
func (t *tokenSource) token(ctx context.Context) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fetch != nil && (t.tok == "" || (t.maxAge > 0 && time.Since(t.fetched) > t.maxAge)) {
		tok, err := t.fetch(ctx)
		if err != nil {
			return "", err
		}
		t.tok, t.fetched = tok, time.Now()
	}
	return t.tok, nil
}

// refresh fetches a new token after etcd refused stale; it reports false
// when there is no way to get one.
func (t *tokenSource) refresh(ctx context.Context, stale string) bool {
	if t.fetch == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tok != stale && t.tok != "" {
		return true // someone else refreshed it meanwhile
	}
	tok, err := t.fetch(ctx)
	if err != nil {
		return false
	}
	t.tok, t.fetched = tok, time.Now()
	return true
}

// staleToken reports etcd's refusals that a new token cures.
func staleToken(err error) bool {
	err = rpctypes.Error(err)
	return errors.Is(err, rpctypes.ErrInvalidAuthToken) || errors.Is(err, rpctypes.ErrAuthOldRevision) ||
		errors.Is(err, rpctypes.ErrUserEmpty)
}

// withToken puts the token where an in-process call to the etcd server
// looks for it: the incoming gRPC metadata.
func withToken(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.NewIncomingContext(ctx, metadata.Pairs(rpctypes.TokenFieldNameGRPC, tok))
}

// invoke runs call with the token, and once more with a fresh token when
// etcd refuses the first as stale.
func invoke[T any](ctx context.Context, src *tokenSource, call func(context.Context) (T, error)) (T, error) {
	tok, err := src.token(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	resp, err := call(withToken(ctx, tok))
	if err != nil && staleToken(err) && src.refresh(ctx, tok) {
		tok, terr := src.token(ctx)
		if terr != nil {
			return resp, err
		}
		return call(withToken(ctx, tok))
	}
	return resp, err
}

// userClient returns an etcd client that calls the in-process etcd server
// directly, as the user whose tokens src gives: etcd checks every call
// against that user's roles. (etcd's v3client does the same without a
// user, which fails once auth is enabled.)
func userClient(s *etcdserver.EtcdServer, src *tokenSource, lg *zap.Logger) *clientv3.Client {
	c := clientv3.NewCtxClient(context.Background(), clientv3.WithZapLogger(lg))
	c.KV = clientv3.NewKVFromKVClient(&userKV{adapter.KvServerToKvClient(v3rpc.NewQuotaKVServer(s)), src}, c)
	c.Lease = clientv3.NewLeaseFromLeaseClient(&userLease{adapter.LeaseServerToLeaseClient(v3rpc.NewQuotaLeaseServer(s)), src}, c, time.Second)
	c.Watcher = &blankWatcher{clientv3.NewWatchFromWatchClient(&userWatch{adapter.WatchServerToWatchClient(v3rpc.NewWatchServer(s)), src}, c)}
	c.Cluster = clientv3.NewClusterFromClusterClient(adapter.ClusterServerToClusterClient(v3rpc.NewClusterServer(s)), c)
	c.Auth = clientv3.NewAuthFromAuthClient(&userAuth{adapter.AuthServerToAuthClient(v3rpc.NewAuthServer(s)), src}, c)
	return c
}

type userKV struct {
	pb.KVClient
	src *tokenSource
}

func (k *userKV) Range(ctx context.Context, in *pb.RangeRequest, opts ...grpc.CallOption) (*pb.RangeResponse, error) {
	return invoke(ctx, k.src, func(ctx context.Context) (*pb.RangeResponse, error) { return k.KVClient.Range(ctx, in, opts...) })
}

func (k *userKV) Put(ctx context.Context, in *pb.PutRequest, opts ...grpc.CallOption) (*pb.PutResponse, error) {
	return invoke(ctx, k.src, func(ctx context.Context) (*pb.PutResponse, error) { return k.KVClient.Put(ctx, in, opts...) })
}

func (k *userKV) DeleteRange(ctx context.Context, in *pb.DeleteRangeRequest, opts ...grpc.CallOption) (*pb.DeleteRangeResponse, error) {
	return invoke(ctx, k.src, func(ctx context.Context) (*pb.DeleteRangeResponse, error) {
		return k.KVClient.DeleteRange(ctx, in, opts...)
	})
}

func (k *userKV) Txn(ctx context.Context, in *pb.TxnRequest, opts ...grpc.CallOption) (*pb.TxnResponse, error) {
	return invoke(ctx, k.src, func(ctx context.Context) (*pb.TxnResponse, error) { return k.KVClient.Txn(ctx, in, opts...) })
}

func (k *userKV) Compact(ctx context.Context, in *pb.CompactionRequest, opts ...grpc.CallOption) (*pb.CompactionResponse, error) {
	return invoke(ctx, k.src, func(ctx context.Context) (*pb.CompactionResponse, error) { return k.KVClient.Compact(ctx, in, opts...) })
}

type userLease struct {
	pb.LeaseClient
	src *tokenSource
}

func (l *userLease) LeaseGrant(ctx context.Context, in *pb.LeaseGrantRequest, opts ...grpc.CallOption) (*pb.LeaseGrantResponse, error) {
	return invoke(ctx, l.src, func(ctx context.Context) (*pb.LeaseGrantResponse, error) {
		return l.LeaseClient.LeaseGrant(ctx, in, opts...)
	})
}

func (l *userLease) LeaseRevoke(ctx context.Context, in *pb.LeaseRevokeRequest, opts ...grpc.CallOption) (*pb.LeaseRevokeResponse, error) {
	return invoke(ctx, l.src, func(ctx context.Context) (*pb.LeaseRevokeResponse, error) {
		return l.LeaseClient.LeaseRevoke(ctx, in, opts...)
	})
}

func (l *userLease) LeaseTimeToLive(ctx context.Context, in *pb.LeaseTimeToLiveRequest, opts ...grpc.CallOption) (*pb.LeaseTimeToLiveResponse, error) {
	return invoke(ctx, l.src, func(ctx context.Context) (*pb.LeaseTimeToLiveResponse, error) {
		return l.LeaseClient.LeaseTimeToLive(ctx, in, opts...)
	})
}

func (l *userLease) LeaseLeases(ctx context.Context, in *pb.LeaseLeasesRequest, opts ...grpc.CallOption) (*pb.LeaseLeasesResponse, error) {
	return invoke(ctx, l.src, func(ctx context.Context) (*pb.LeaseLeasesResponse, error) {
		return l.LeaseClient.LeaseLeases(ctx, in, opts...)
	})
}

// LeaseKeepAlive opens the stream with the current token (etcd does not
// check keep-alives against roles).
func (l *userLease) LeaseKeepAlive(ctx context.Context, opts ...grpc.CallOption) (pb.Lease_LeaseKeepAliveClient, error) {
	tok, err := l.src.token(ctx)
	if err != nil {
		return nil, err
	}
	return l.LeaseClient.LeaseKeepAlive(withToken(ctx, tok), opts...)
}

type userWatch struct {
	pb.WatchClient
	src *tokenSource
}

// Watch opens the stream with the current token: etcd checks each watch
// created on the stream against the stream's token. An established watch
// survives the token's expiry; a watch created on a stream whose token
// expired is cancelled with an auth error, which the registry reports.
func (w *userWatch) Watch(ctx context.Context, opts ...grpc.CallOption) (pb.Watch_WatchClient, error) {
	tok, err := w.src.token(ctx)
	if err != nil {
		return nil, err
	}
	return w.WatchClient.Watch(withToken(ctx, tok), opts...)
}

type userAuth struct {
	pb.AuthClient
	src *tokenSource
}

func (a *userAuth) UserGet(ctx context.Context, in *pb.AuthUserGetRequest, opts ...grpc.CallOption) (*pb.AuthUserGetResponse, error) {
	return invoke(ctx, a.src, func(ctx context.Context) (*pb.AuthUserGetResponse, error) {
		return a.AuthClient.UserGet(ctx, in, opts...)
	})
}

func (a *userAuth) RoleGet(ctx context.Context, in *pb.AuthRoleGetRequest, opts ...grpc.CallOption) (*pb.AuthRoleGetResponse, error) {
	return invoke(ctx, a.src, func(ctx context.Context) (*pb.AuthRoleGetResponse, error) {
		return a.AuthClient.RoleGet(ctx, in, opts...)
	})
}

// blankWatcher hides the caller's context values from etcd's in-process
// watch server, as v3client does (tracing data races otherwise).
type blankWatcher struct{ clientv3.Watcher }

type blankContext struct{ context.Context }

func (*blankContext) String() string { return "(blankCtx)" }

func (w *blankWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	return w.Watcher.Watch(&blankContext{ctx}, key, opts...)
}
