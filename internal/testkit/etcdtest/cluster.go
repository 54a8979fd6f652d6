package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Cluster is a real multi-member etcd cluster running in-process on
// loopback ports, each member with its own data directory.
type Cluster struct {
	token   string
	dir     string
	fsync   bool
	mu      sync.Mutex
	members []*Member
}

// Member is one member of a Cluster.
type Member struct {
	Name      string
	clientURL url.URL
	peerURL   url.URL
	dir       string
	initial   string
	state     string
	fsync     bool
	mu        sync.Mutex
	etcd      *embed.Etcd
}

// StartCluster starts an n-member cluster and stops it when the test ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c, err := NewCluster(n, ClusterOptions{Dir: tb.TempDir()})
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// ClusterOptions configure NewCluster.
type ClusterOptions struct {
	// Dir holds the members' data directories (required).
	Dir string
	// Fsync makes members sync their WAL like production etcd (tests
	// skip it by default for speed).
	Fsync bool
}

// NewCluster starts an n-member cluster with data under opts.Dir; the
// caller must Close it.
func NewCluster(n int, opts ClusterOptions) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("etcdtest: ClusterOptions.Dir is required")
	}
	c := &Cluster{token: fmt.Sprintf("beacon-test-%d", time.Now().UnixNano()), dir: opts.Dir, fsync: opts.Fsync}
	for i := range n {
		m, err := c.newMember(fmt.Sprintf("m%d", i+1))
		if err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
	}
	initial := c.InitialCluster()
	for _, m := range c.members {
		m.initial, m.state = initial, embed.ClusterStateFlagNew
	}
	// Start every member, then wait: a member is ready only once a
	// quorum runs.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.members {
		wg.Go(func() { errs[i] = m.start(c.token) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	return c, nil
}

func (c *Cluster) newMember(name string) (*Member, error) {
	dir := filepath.Join(c.dir, name)
	cport, err1 := FreePort()
	pport, err2 := FreePort()
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &Member{
		Name:      name,
		clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)},
		peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)},
		dir:       dir,
		fsync:     c.fsync,
	}, nil
}

func (m *Member) config(token string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = m.initial
	cfg.InitialClusterToken = token
	cfg.ClusterState = m.state
	cfg.UnsafeNoFsync = !m.fsync
	// Tests add members right after start.
	cfg.StrictReconfigCheck = false
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	if os.Getenv("BEACON_TEST_ETCD_LOG") == "" {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	}
	return cfg
}

func (m *Member) start(token string) error {
	e, err := embed.StartEtcd(m.config(token))
	if err != nil {
		return fmt.Errorf("start %s: %w", m.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("%s failed while starting: %w", m.Name, err)
	case <-time.After(StartTimeout):
		e.Close()
		return fmt.Errorf("%s not ready after %v", m.Name, StartTimeout)
	}
	m.mu.Lock()
	m.etcd = e
	m.mu.Unlock()
	return nil
}

// ClientURL returns the member's client URL.
func (m *Member) ClientURL() string { return m.clientURL.String() }

// PeerURL returns the member's peer URL.
func (m *Member) PeerURL() string { return m.peerURL.String() }

// Running reports whether the member is started.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd != nil
}

// Stop stops the member (idempotent), keeping its data for Restart.
func (m *Member) Stop() {
	m.mu.Lock()
	e := m.etcd
	m.etcd = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Members returns the members, in start order.
func (c *Cluster) Members() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Member(nil), c.members...)
}

// Endpoints returns the client URLs of all members.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members() {
		out = append(out, m.ClientURL())
	}
	return out
}

// PeerURLs returns the peer URLs of all members.
func (c *Cluster) PeerURLs() []string {
	var out []string
	for _, m := range c.Members() {
		out = append(out, m.PeerURL())
	}
	return out
}

// InitialCluster returns the --initial-cluster string of the members.
func (c *Cluster) InitialCluster() string {
	var parts []string
	for _, m := range c.Members() {
		parts = append(parts, m.Name+"="+m.PeerURL())
	}
	return strings.Join(parts, ",")
}

// Client returns a client of every member, closed when the test ends.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// AddMember adds a new member as etcd's runtime reconfiguration guide
// does (MemberAdd, then start it with --initial-cluster-state=existing)
// and returns it once ready. It starts the member only when every running
// member has applied the addition: the new member checks its configuration
// against the first peer that answers, and one that has not applied the
// MemberAdd yet refuses it ("member count is unequal").
func (c *Cluster) AddMember(tb testing.TB) *Member {
	tb.Helper()
	m, err := c.newMember(fmt.Sprintf("m%d", len(c.Members())+1))
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	cli := c.Client(tb)
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	added, err := cli.MemberAdd(ctx, []string{m.PeerURL()})
	if err != nil {
		tb.Fatalf("etcdtest: member add: %v", err)
	}
	for _, other := range c.Members() {
		if other.Running() {
			if err := other.waitMembers(ctx, len(added.Members)); err != nil {
				tb.Fatalf("etcdtest: %v", err)
			}
		}
	}
	c.mu.Lock()
	c.members = append(c.members, m)
	c.mu.Unlock()
	m.initial, m.state = c.InitialCluster(), embed.ClusterStateFlagExisting
	if err := m.start(c.token); err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	return m
}

// waitMembers waits until the member's own view of the membership (a
// serializable MemberList) counts n members.
func (m *Member) waitMembers(ctx context.Context, n int) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		l, err := cli.MemberList(ctx, clientv3.WithSerializable())
		if err == nil && len(l.Members) == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s has not applied the member addition (%d members): %w", m.Name, n, ctx.Err())
		case <-tick.C:
		}
	}
}

// Close stops every member (see StopAll); data directories stay.
func (c *Cluster) Close() { c.StopAll() }

// StopAll stops every member, keeping their data for Restart: followers
// first, so that the leader does not wait to hand its leadership to a
// member that is going away.
func (c *Cluster) StopAll() {
	var wg sync.WaitGroup
	var leaders []*Member
	for _, m := range c.Members() {
		if m.isLeader() {
			leaders = append(leaders, m)
			continue
		}
		wg.Go(m.Stop)
	}
	wg.Wait()
	for _, m := range leaders {
		m.Stop()
	}
}

func (m *Member) isLeader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID()
}

// Restart starts a stopped member again on its data and ports.
func (c *Cluster) Restart(m *Member) error {
	if m.Running() {
		return errors.New("etcdtest: restart of a running member")
	}
	m.state = embed.ClusterStateFlagExisting
	return m.start(c.token)
}
