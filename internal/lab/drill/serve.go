package drill

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ServeNodes runs each member as a `beacon serve` node (embedded etcd
// 3.7.3) that joins its cluster through a v3 discovery token — the path
// users take to scale out. For every cluster it first starts a discovery
// service (one more `beacon serve`, alone, on the same network) and creates
// a token of the cluster's size there.
type ServeNodes struct {
	// Beacon returns the command that runs the beacon binary with args.
	Beacon func(args ...string) *exec.Cmd

	mu     sync.Mutex
	tokens map[*etcdproc.Cluster]serveToken
}

type serveToken struct {
	token    string
	endpoint string
}

var _ etcdproc.Preparer = (*ServeNodes)(nil)

// Name implements etcdproc.Launcher.
func (*ServeNodes) Name() string { return "beacon serve nodes joined by a discovery token" }

// Prepare implements etcdproc.Preparer: it starts the cluster's discovery
// service and creates its token.
func (s *ServeNodes) Prepare(ctx context.Context, c *etcdproc.Cluster) error {
	disc, err := c.StartAux(ctx, "discovery", serveAlone{s.Beacon})
	if err != nil {
		return fmt.Errorf("discovery service: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{disc.ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	token := c.Token()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := bootstrap.CreateToken(cctx, cli, token, len(c.Members())); err != nil {
		return fmt.Errorf("create discovery token: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens == nil {
		s.tokens = map[*etcdproc.Cluster]serveToken{}
	}
	s.tokens[c] = serveToken{token: token, endpoint: disc.ClientURL}
	return nil
}

// Command implements etcdproc.Launcher. A restarted node finds its data
// directory and ignores the token, as etcd does.
func (s *ServeNodes) Command(m *etcdproc.Member) *exec.Cmd {
	s.mu.Lock()
	t := s.tokens[m.Cluster()]
	s.mu.Unlock()
	return s.Beacon("serve", "--name", m.Name, "--data-dir", m.DataDir,
		"--listen-client-urls", m.ClientURL, "--listen-peer-urls", m.PeerURL, "--http-addr", m.HTTPAddr,
		"--discovery-token", t.token, "--discovery-endpoints", t.endpoint, "--etcd-log-level", "warn", "--dns-addr=", "--xds-addr=")
}

// serveAlone runs a single-node `beacon serve` (the discovery service).
type serveAlone struct {
	beacon func(args ...string) *exec.Cmd
}

func (serveAlone) Name() string { return "beacon serve" }

func (s serveAlone) Command(m *etcdproc.Member) *exec.Cmd {
	return s.beacon("serve", "--name", m.Name, "--data-dir", m.DataDir,
		"--listen-client-urls", m.ClientURL, "--listen-peer-urls", m.PeerURL, "--http-addr", m.HTTPAddr,
		"--etcd-log-level", "warn", "--dns-addr=", "--xds-addr=")
}
