package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/internal/grpcstop"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
)

// etcdStartTimeout bounds how long embedded etcd may take to become ready
// when the caller's context has no deadline.
const etcdStartTimeout = 60 * time.Second

// member is the embedded etcd member's: the etcd it runs, the server's
// own in-process client of it, and its data directory.
type member struct {
	etcd   *embed.Etcd
	client *clientv3.Client // in-process client of the embedded etcd
	// closing is set when Close stops embedded etcd (etcdlog.go).
	closing atomic.Bool
	// dataDir is what the data directory held before etcd started, and
	// ready whether etcd joined its cluster (startcheck.go).
	dataDir *dataDirGuard
	ready   bool
	// grpcMu guards grpcServers: embedded etcd's client gRPC servers,
	// which its serving goroutines hand over as they make them
	// (embed.Config.ServiceRegister), for close to end their streams.
	grpcMu      sync.Mutex
	grpcServers []*grpc.Server
}

// clientStreamGrace is how long closing the member lets etcd's client
// RPCs finish before it ends the streams left: watches and keep-alive
// streams never end by themselves, and etcd's own Close waits its request
// timeout (7 s by default) for them while its raft and lessor still run
// and no new stream — a keep-alive of a registry session — is taken: the
// leases of this member's clients expired during a graceful restart.
// Unary requests take milliseconds; a second leaves the leases (2 s and
// more, renewed every third of it) their time.
const clientStreamGrace = time.Second

// registerGRPC records one of etcd's client gRPC servers.
func (m *member) registerGRPC(gs *grpc.Server) {
	m.grpcMu.Lock()
	defer m.grpcMu.Unlock()
	m.grpcServers = append(m.grpcServers, gs)
}

// endClientStreams stops etcd's client gRPC servers gracefully and, after
// grace (at once when abort is done), ends every RPC still open, so that
// embed's Close finds them stopped. It reports whether RPCs were left to
// end.
func (m *member) endClientStreams(abort context.Context, grace time.Duration) (cut bool) {
	m.grpcMu.Lock()
	servers := slices.Clone(m.grpcServers)
	m.grpcMu.Unlock()
	return grpcstop.Stop(abort, grace, servers...)
}

// close closes the in-process client, ends etcd's client RPCs (after
// clientStreamGrace; at once when abort is done), then closes embedded
// etcd.
func (m *member) close(abort context.Context, log *slog.Logger) {
	if m.client != nil {
		_ = m.client.Close()
	}
	if m.etcd == nil {
		return
	}
	m.closing.Store(true) // its listeners' loops end now: not errors (etcdlog.go)
	if !m.ready {
		// embed's Close waits for the client servers, which wait for
		// readiness or for the server to stop: a member that never
		// became ready (no quorum) must be stopped first, or Close
		// never returns.
		m.etcd.Server.HardStop()
	}
	if m.endClientStreams(abort, clientStreamGrace) {
		log.Info("ended the etcd client streams still open (watches, keep-alives); their clients reconnect to another member or when this one is back",
			"grace", clientStreamGrace)
	}
	m.etcd.Close()
}

// removeFailedFirstStart removes, after a failed first start, what it
// wrote to the data directory, unless the member had joined a cluster of
// several members (they now count it as a member: its data must stay).
func (s *Server) removeFailedFirstStart() {
	if s.member.dataDir == nil || !s.member.dataDir.first {
		return
	}
	if s.member.ready {
		if m, err := types.NewURLsMap(s.cfg.InitialCluster); err != nil || len(m) > 1 {
			return
		}
	}
	if err := s.member.dataDir.cleanup(); err != nil {
		s.log.Warn("could not remove what the failed start wrote to the data directory", "data-dir", s.cfg.DataDir, "err", err)
	}
}

// startEtcd starts embedded etcd and waits until it is ready.
func (s *Server) startEtcd(ctx context.Context) error {
	s.member.dataDir = guardDataDir(s.cfg.DataDir) // startcheck.go
	if err := checkDataDir(s.cfg.DataDir); err != nil {
		return err
	}
	ecfg, err := s.etcdConfig()
	if err != nil {
		return err
	}
	e, err := embed.StartEtcd(ecfg)
	if err != nil {
		return explainEtcdError(err)
	}
	s.member.etcd = e
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, etcdStartTimeout)
		defer cancel()
	}
	select {
	case <-e.Server.ReadyNotify():
		s.member.ready = true
	case err := <-e.Err():
		if rerr := s.removedErr(e); rerr != nil {
			return rerr
		}
		return fmt.Errorf("embedded etcd failed while starting: %w", explainEtcdError(err))
	case <-e.Server.StopNotify():
		return s.etcdStopped(e)
	case <-ctx.Done():
		return fmt.Errorf("embedded etcd not ready (has the cluster a quorum? see Config.InitialCluster): %w", context.Cause(ctx))
	}
	s.life.wg.Add(1)
	go func() {
		defer s.life.wg.Done()
		select {
		case err, ok := <-e.Err():
			if ok && err != nil {
				s.fail(fmt.Errorf("embedded etcd: %w", err))
			}
		case <-e.Server.StopNotify():
			// Stopped by Close (nothing to report), or by etcd itself
			// (e.g. removed from its cluster).
			if !s.member.closing.Load() {
				s.fail(s.etcdStopped(e))
			}
		}
	}()
	return nil
}

// etcdStopped explains why the embedded etcd stopped on its own: most
// often this member was removed from its cluster, which etcd reports to no
// caller (only in its log), and which needs the operator to act.
func (s *Server) etcdStopped(e *embed.Etcd) error {
	if err := s.removedErr(e); err != nil {
		return err
	}
	return errors.New("embedded etcd stopped on its own (its log above says why)")
}

// removedCheckTimeout bounds asking the other members whether this one is
// still in their cluster.
const removedCheckTimeout = 5 * time.Second

// removedErr says what to do when this member has been removed from its
// cluster (while running, or before it was started again with its old data
// directory); nil when it has not, or when that cannot be told.
func (s *Server) removedErr(e *embed.Etcd) error {
	ctx, cancel := context.WithTimeout(s.life.abortCtx, removedCheckTimeout)
	defer cancel()
	if !s.memberRemoved(ctx, e) {
		return nil
	}
	return fmt.Errorf("embedded etcd stopped: this member (%s, ID %s) was removed from its cluster (etcdctl member remove); "+
		"it cannot serve again with its data: to rejoin, remove Config.DataDir %s, add it back (etcdctl member add %s --peer-urls=...) "+
		"and start it with Config.InitialClusterState existing and Config.InitialCluster set to the list member add prints (ETCD_INITIAL_CLUSTER)", s.cfg.Name, e.Server.MemberID(), s.cfg.DataDir, s.cfg.Name)
}

// memberRemoved reports whether the stopped member e is no longer in its
// cluster, as etcd's API says: removed in the membership it applied
// itself, or, when it learnt its removal from a peer (etcd stops the
// member without applying it), absent from the member list the other
// members serve on their client URLs.
func (s *Server) memberRemoved(ctx context.Context, e *embed.Etcd) bool {
	self := e.Server.MemberID()
	cluster := e.Server.Cluster()
	if c, ok := cluster.(interface{ IsIDRemoved(types.ID) bool }); ok && c.IsIDRemoved(self) {
		return true
	}
	var endpoints []string
	for _, m := range cluster.Members() {
		if m.ID != self {
			endpoints = append(endpoints, m.ClientURLs...)
		}
	}
	if len(endpoints) == 0 {
		return false
	}
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: removedCheckTimeout, Logger: zapFor(s.log)}
	if f := s.sec.ClientTLS; f.CertFile != "" || f.TrustedCAFile != "" {
		tlsCfg, err := etcdTLSInfo(f).ClientConfig()
		if err != nil {
			return false
		}
		cfg.TLS = tlsCfg
	}
	absent, err := absentFromCluster(ctx, uint64(self), cfg)
	if err != nil {
		s.log.Warn("could not ask the other members whether this one was removed from the cluster", "err", err)
	}
	return absent
}

// absentFromCluster reports whether member id is missing from the member
// list of the cluster cfg reaches (a linearizable read: a removal the
// cluster committed is seen).
func absentFromCluster(ctx context.Context, id uint64, cfg clientv3.Config) (bool, error) {
	cli, err := clientv3.New(cfg)
	if err != nil {
		return false, err
	}
	defer cli.Close()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return false, err
	}
	for _, m := range resp.Members {
		if m.ID == id {
			return false, nil
		}
	}
	return true, nil
}

func (s *Server) etcdConfig() (*embed.Config, error) {
	c := s.cfg
	ec := embed.NewConfig()
	ec.Name = c.Name
	ec.Dir = c.DataDir
	var err error
	parse := func(flag string, in []string) []url.URL {
		out := make([]url.URL, 0, len(in))
		for _, raw := range in {
			u, perr := url.Parse(raw)
			if perr != nil {
				err = errors.Join(err, fmt.Errorf("--%s %q: %w", flag, raw, perr))
				continue
			}
			out = append(out, *u)
		}
		return out
	}
	ec.ListenClientUrls = parse("listen-client-urls", c.ListenClientURLs)
	ec.AdvertiseClientUrls = parse("advertise-client-urls", c.AdvertiseClientURLs)
	ec.ListenPeerUrls = parse("listen-peer-urls", c.ListenPeerURLs)
	ec.AdvertisePeerUrls = parse("initial-advertise-peer-urls", c.AdvertisePeerURLs)
	if err != nil {
		return nil, err
	}
	ec.ServiceRegister = s.member.registerGRPC // for close to end client streams
	ec.InitialCluster = c.InitialCluster
	ec.ClusterState = c.InitialClusterState
	ec.InitialClusterToken = c.InitialClusterToken
	ec.UnsafeNoFsync = c.UnsafeNoFsync
	if c.AutoCompactionRetention > 0 {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = c.AutoCompactionRetention.String()
	}
	level := zapcore.WarnLevel
	if c.EtcdLogLevel != nil {
		level = *c.EtcdLogLevel
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLogger(s.log.With("component", "etcd"), level, &s.member.closing))
	if err := s.applySecurity(ec); err != nil {
		return nil, err
	}
	return ec, nil
}

// checkDataDir creates the data directory if needed and checks that it is
// a writable directory, so that a bad --data-dir gives one clear line.
func checkDataDir(dir string) error {
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("Config.DataDir %q exists and is not a directory: choose another path", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("Config.DataDir %q cannot be created: %w", dir, unwrapPath(err))
	}
	probe, err := os.CreateTemp(dir, ".beacon-probe-*")
	if err != nil {
		return fmt.Errorf("Config.DataDir %q is not writable: %w", dir, unwrapPath(err))
	}
	name := probe.Name()
	_ = probe.Close()
	_ = os.Remove(name)
	if abs, err := filepath.Abs(dir); err == nil && abs == "/" {
		return fmt.Errorf("Config.DataDir %q: refusing to use the root directory", dir)
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// explainEtcdError adds advice to embedded etcd's start errors.
func explainEtcdError(err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w: a port of Config.ListenClientURLs or Config.ListenPeerURLs is in use (another beacon serve or etcd?): choose other URLs", err)
	}
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EROFS) {
		return fmt.Errorf("%w: check Config.DataDir permissions", err)
	}
	return err
}
