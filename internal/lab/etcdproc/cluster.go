package etcdproc

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Launcher makes the command that runs one member.
type Launcher interface {
	// Command returns the command that starts m (on its data directory,
	// addresses and ports; the first start bootstraps the cluster).
	Command(m *Member) *exec.Cmd
	// Name describes the members ("etcd 3.7.3", "beacon serve").
	Name() string
}

// Preparer is implemented by a Launcher that must set things up once the
// members' addresses are known and before they start (a discovery token,
// say). StartCluster calls it.
type Preparer interface {
	Prepare(ctx context.Context, c *Cluster) error
}

// EtcdMembers runs members from an etcd binary (etcd's own flags; this
// repository builds one from etcd 3.7.3 as internal/lab/etcd).
type EtcdMembers struct {
	// Bin is the etcd binary.
	Bin string
	// NoFsync passes --unsafe-no-fsync (faster drills on a shared disk).
	NoFsync bool
	// LogLevel is etcd's --log-level ("warn" when empty).
	LogLevel string
	// FsyncDelay says that Bin is the slow-disk build of the member binary
	// (internal/lab/etcd built with the beacon_fsync_delay tag and an overlay
	// of etcd's fileutil: see internal/lab/etcd/fsyncdelay), whose WAL syncs
	// wait for the delay Member.SetFsyncDelay sets. It needs NoFsync off:
	// a member that does not sync never waits.
	FsyncDelay bool
}

// FsyncDelayEnv names the file from which the slow-disk build of the
// member binary reads its fsync delay.
const FsyncDelayEnv = "BEACON_ETCD_FSYNC_DELAY_FILE"

// fsyncDelayer is a Launcher whose members can be given a slow disk.
type fsyncDelayer interface {
	// fsyncDelayFile returns the file from which m reads its fsync delay
	// ("" when it has none).
	fsyncDelayFile(m *Member) string
}

func (e EtcdMembers) fsyncDelayFile(m *Member) string {
	if !e.FsyncDelay || e.NoFsync {
		return ""
	}
	return filepath.Join(m.c.dir, m.Name+".fsync-delay")
}

// Name implements Launcher.
func (EtcdMembers) Name() string { return "etcd 3.7.3 member processes" }

// Command implements Launcher.
func (e EtcdMembers) Command(m *Member) *exec.Cmd {
	args := []string{
		"--name", m.Name, "--data-dir", m.DataDir,
		"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", m.c.InitialCluster(), "--initial-cluster-token", m.c.token,
		"--initial-cluster-state", "new", "--log-level", cmp.Or(e.LogLevel, "warn"),
	}
	if e.NoFsync {
		args = append(args, "--unsafe-no-fsync")
	}
	cmd := exec.Command(e.Bin, args...)
	if f := e.fsyncDelayFile(m); f != "" {
		cmd.Env = append(os.Environ(), FsyncDelayEnv+"="+f)
	}
	return cmd
}

// Cluster is a cluster of member processes on a Network. Every method is
// safe for concurrent use. Close kills every process and removes the
// network.
type Cluster struct {
	launch Launcher
	net    *Network
	dir    string
	token  string

	mu      sync.Mutex
	members []*Member
	aux     []*Member // helper processes on the network (not members)
	closed  bool
}

// Member is one member process. It can be paused (SIGSTOP), resumed,
// killed (SIGKILL), restarted on its data, and — on a Netns network —
// partitioned away and healed.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	HTTPAddr  string // the member's third port (beacon serve's HTTP API)
	DataDir   string

	c      *Cluster
	host   *host
	launch Launcher // nil: the cluster's

	mu          sync.Mutex
	cmd         *exec.Cmd
	exited      chan struct{}
	exitErr     error
	paused      bool
	partitioned bool
	log         *os.File
}

// StartCluster starts n members with launch on network nw, with their data
// and logs under dir, and waits until each answers /health. On failure it
// closes what it started.
func StartCluster(ctx context.Context, launch Launcher, nw *Network, n int, dir string) (*Cluster, error) {
	c := &Cluster{launch: launch, net: nw, dir: dir, token: fmt.Sprintf("drill-%d-%d", os.Getpid(), time.Now().UnixNano())}
	for i := range n {
		h, err := nw.addHost()
		if err != nil {
			c.Close()
			return nil, err
		}
		name := fmt.Sprintf("m%d", i+1)
		m := &Member{
			Name:      name,
			ClientURL: fmt.Sprintf("http://%s:%d", h.addr, h.ports["client"]),
			PeerURL:   fmt.Sprintf("http://%s:%d", h.addr, h.ports["peer"]),
			HTTPAddr:  fmt.Sprintf("%s:%d", h.addr, h.ports["http"]),
			DataDir:   filepath.Join(dir, name),
			c:         c,
			host:      h,
		}
		c.members = append(c.members, m)
	}
	if p, ok := launch.(Preparer); ok {
		if err := p.Prepare(ctx, c); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, m := range c.members {
		if err := m.start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, m := range c.members {
		if err := m.WaitHealthy(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// StartAux starts a helper process on the cluster's network — a place of
// its own, with its own ports, but not a member (a discovery service, say)
// — runs it with launch, and waits until it answers /health. Close kills
// it with the members.
func (c *Cluster) StartAux(ctx context.Context, name string, launch Launcher) (*Member, error) {
	h, err := c.net.addHost()
	if err != nil {
		return nil, err
	}
	m := &Member{
		Name:      name,
		ClientURL: fmt.Sprintf("http://%s:%d", h.addr, h.ports["client"]),
		PeerURL:   fmt.Sprintf("http://%s:%d", h.addr, h.ports["peer"]),
		HTTPAddr:  fmt.Sprintf("%s:%d", h.addr, h.ports["http"]),
		DataDir:   filepath.Join(c.dir, name),
		c:         c,
		host:      h,
		launch:    launch,
	}
	c.mu.Lock()
	c.aux = append(c.aux, m)
	c.mu.Unlock()
	if err := m.start(); err != nil {
		return nil, err
	}
	return m, m.WaitHealthy(ctx)
}

// Token is the cluster's initial cluster token.
func (c *Cluster) Token() string { return c.token }

// InitialCluster returns the members as etcd's --initial-cluster value.
func (c *Cluster) InitialCluster() string {
	parts := make([]string, 0, len(c.members))
	for _, m := range c.members {
		parts = append(parts, m.Name+"="+m.PeerURL)
	}
	return strings.Join(parts, ",")
}

// Members returns the members in start order.
func (c *Cluster) Members() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Member(nil), c.members...)
}

// Endpoints returns every member's client URL.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members() {
		eps = append(eps, m.ClientURL)
	}
	return eps
}

// Network returns the network the members live on.
func (c *Cluster) Network() *Network { return c.net }

// Launcher returns how the members run.
func (c *Cluster) Launcher() Launcher { return c.launch }

// Leader returns the member that is leader by its own account, asking each
// running, reachable member (bounded by ctx).
func (c *Cluster) Leader(ctx context.Context) (*Member, error) {
	var leader *Member
	err := c.eachStatus(ctx, func(m *Member, st *clientv3.StatusResponse) bool {
		if st.Leader != 0 && st.Leader == st.Header.MemberId {
			leader = m
			return false
		}
		return true
	})
	if leader == nil {
		return nil, fmt.Errorf("etcdproc: no leader found: %w", err)
	}
	return leader, nil
}

// Term returns the highest raft term the running, reachable members
// report (bounded by ctx): it grows with every election, so two readings
// tell whether the members elected a leader between them.
func (c *Cluster) Term(ctx context.Context) (uint64, error) {
	var term uint64
	err := c.eachStatus(ctx, func(_ *Member, st *clientv3.StatusResponse) bool {
		term = max(term, st.RaftTerm)
		return true
	})
	if term == 0 {
		return 0, fmt.Errorf("etcdproc: no member reported its raft term: %w", err)
	}
	return term, nil
}

// eachStatus asks each running member that is neither paused nor cut off
// for its status and hands it to fn until fn returns false; it returns
// the errors of those that did not answer.
func (c *Cluster) eachStatus(ctx context.Context, fn func(*Member, *clientv3.StatusResponse) bool) error {
	var errs []error
	for _, m := range c.Members() {
		if !m.Running() || m.Paused() || m.Partitioned() {
			continue
		}
		st, err := m.status(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !fn(m, st) {
			break
		}
	}
	return errors.Join(errs...)
}

// WaitLeader waits (polling every 50 ms, bounded by ctx) until a member is
// leader by its own account and returns it.
func (c *Cluster) WaitLeader(ctx context.Context) (*Member, error) {
	for {
		m, err := c.Leader(ctx)
		if err == nil {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close resumes and kills every member and removes the network. It is
// idempotent.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	c.mu.Lock()
	all := append(append([]*Member(nil), c.members...), c.aux...)
	c.mu.Unlock()
	for _, m := range all {
		_ = m.Kill()
	}
	c.net.Close()
}

func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return fmt.Errorf("etcdproc: %s is running", m.Name)
	}
	if err := os.MkdirAll(m.c.dir, 0o755); err != nil {
		return err
	}
	if m.log == nil {
		f, err := os.OpenFile(filepath.Join(m.c.dir, m.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		m.log = f
	}
	launch := m.c.launch
	if m.launch != nil {
		launch = m.launch
	}
	cmd := launch.Command(m)
	m.c.net.wrap(m.host, cmd)
	cmd.Stdout, cmd.Stderr = m.log, m.log
	// The member dies with this process, even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(m.log, "=== etcdproc: start %s: %s\n", m.Name, strings.Join(cmd.Args, " "))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdproc: start %s: %w", m.Name, err)
	}
	exited := make(chan struct{})
	m.cmd, m.exited, m.exitErr, m.paused = cmd, exited, nil, false
	go func() {
		err := cmd.Wait()
		m.mu.Lock()
		m.exitErr = err
		fmt.Fprintf(m.log, "=== etcdproc: %s exited at %s: %v (paused: %v)\n", m.Name, time.Now().Format(time.RFC3339Nano), err, m.paused)
		m.mu.Unlock()
		close(exited)
	}()
	return nil
}

// Cluster returns the member's cluster.
func (m *Member) Cluster() *Cluster { return m.c }

// Running reports whether the member's process runs (possibly paused).
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

// Pid is the member's process ID while it runs (0 when it does not): for
// reading its CPU time and resident memory from /proc.
func (m *Member) Pid() int {
	if !m.Running() {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Paused reports whether the member is stopped by Pause.
func (m *Member) Paused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.paused
}

// Partitioned reports whether the member is cut off by Partition.
func (m *Member) Partitioned() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.partitioned
}

func (m *Member) signal(sig syscall.Signal) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return fmt.Errorf("etcdproc: %s is not running", m.Name)
	}
	if err := m.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			// Say how it ended: a member that exits while stopped was
			// killed (SIGKILL is the one signal a stopped process
			// takes), by the kernel or by Pdeathsig (the thread that
			// started it ended).
			exited := m.exited
			m.mu.Unlock()
			<-exited // Wait has reaped it: its exit status comes at once
			m.mu.Lock()
			return fmt.Errorf("etcdproc: signal %v to %s: it had exited (%v; paused: %v): %w; its log:\n%s",
				sig, m.Name, m.exitErr, m.paused, err, tail(m.Log(), 30))
		}
		return fmt.Errorf("etcdproc: signal %v to %s: %w", sig, m.Name, err)
	}
	fmt.Fprintf(m.log, "=== etcdproc: %v to %s at %s\n", sig, m.Name, time.Now().Format(time.RFC3339Nano))
	return nil
}

// Pause stops the member's process (SIGSTOP): its sockets stay open and
// the kernel still accepts connections, but nothing answers.
func (m *Member) Pause() error {
	if err := m.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	m.mu.Lock()
	m.paused = true
	m.mu.Unlock()
	return nil
}

// Resume continues a paused member (SIGCONT).
func (m *Member) Resume() error {
	if err := m.signal(syscall.SIGCONT); err != nil {
		return err
	}
	m.mu.Lock()
	m.paused = false
	m.mu.Unlock()
	return nil
}

// Kill kills the member (SIGKILL, after SIGCONT if paused) and waits for
// its exit; its data stays for Restart. Killing a member that is not
// running is a no-op.
func (m *Member) Kill() error {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-exited
	m.mu.Lock()
	m.cmd, m.paused = nil, false
	fmt.Fprintf(m.log, "=== etcdproc: killed %s at %s\n", m.Name, time.Now().Format(time.RFC3339Nano))
	m.mu.Unlock()
	return nil
}

// Restart starts a killed member again on its data directory.
func (m *Member) Restart() error { return m.start() }

// Partition cuts the member off from everyone (its link goes down: peers
// and clients see their packets dropped). It needs a Netns network.
func (m *Member) Partition() error {
	if err := m.c.net.setLink(m.host, false); err != nil {
		return err
	}
	m.mu.Lock()
	m.partitioned = true
	m.mu.Unlock()
	return nil
}

// Heal brings a partitioned member's link back up.
func (m *Member) Heal() error {
	if err := m.c.net.setLink(m.host, true); err != nil {
		return err
	}
	m.mu.Lock()
	m.partitioned = false
	m.mu.Unlock()
	return nil
}

// ErrNoFsyncDelay is returned by SetFsyncDelay for a member that cannot
// be given a slow disk.
var ErrNoFsyncDelay = errors.New("etcdproc: this member cannot be given a slow disk")

// SetFsyncDelay makes every WAL sync of the member wait d (0: none) from
// now on, as a slow or failing disk does, while it runs. Only members of
// the slow-disk build (EtcdMembers.FsyncDelay, with fsync on) can: for the
// others the error matches ErrNoFsyncDelay and says why.
func (m *Member) SetFsyncDelay(d time.Duration) error {
	fd, ok := m.c.launch.(fsyncDelayer)
	file := ""
	if ok {
		file = fd.fsyncDelayFile(m)
	}
	if file == "" {
		return fmt.Errorf("%w: its members are %s, not the slow-disk build of etcd with fsync on (EtcdMembers.FsyncDelay)", ErrNoFsyncDelay, m.c.launch.Name())
	}
	if _, err := os.Stat(file + ".hooked"); err != nil {
		return fmt.Errorf("%w: %s does not read %s (is its binary the slow-disk build?): %w", ErrNoFsyncDelay, m.Name, file, err)
	}
	if err := os.WriteFile(file+".tmp", []byte(d.String()), 0o644); err != nil {
		return err
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		return err
	}
	m.mu.Lock()
	fmt.Fprintf(m.log, "=== etcdproc: fsync delay of %s set to %v at %s\n", m.Name, d, time.Now().Format(time.RFC3339Nano))
	m.mu.Unlock()
	return nil
}

// Exited is closed when the current process has exited.
func (m *Member) Exited() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.exited == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return m.exited
}

// Log returns the member's output so far (all its runs).
func (m *Member) Log() string {
	b, _ := os.ReadFile(filepath.Join(m.c.dir, m.Name+".log"))
	return string(b)
}

// WaitHealthy polls the member's /health every 50 ms (an external process
// offers no event to wait on) until it reports healthy, failing if the
// process exits or ctx ends.
func (m *Member) WaitHealthy(ctx context.Context) error {
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-m.Exited():
			m.mu.Lock()
			err := m.exitErr
			m.mu.Unlock()
			return fmt.Errorf("etcdproc: %s exited: %v; its log:\n%s", m.Name, err, tail(m.Log(), 30))
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.ClientURL+"/health", nil)
		if resp, err := client.Do(req); err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(b.String(), `"health":"true"`) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcdproc: %s not healthy: %w; its log:\n%s", m.Name, ctx.Err(), tail(m.Log(), 30))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// status asks the member alone for its status.
func (m *Member) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cli.Status(sctx, m.ClientURL)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
