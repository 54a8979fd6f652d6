package etcdtest

import (
	"bytes"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// Process is an etcd member run from a binary (for example Debian's etcd
// 3.4, which still speaks v2 discovery) on loopback ports chosen at start.
type Process struct {
	Name      string
	ClientURL string
	PeerURL   string

	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer
	exited chan struct{}
	err    error
}

// StartProcess starts bin as member name with a fresh data directory, its
// client and peer URLs on free loopback ports, and args appended (e.g.
// "--discovery", url). The process is killed when the test ends; its output
// is logged if the test failed.
func StartProcess(tb testing.TB, bin, name string, args ...string) *Process {
	tb.Helper()
	cport, err1 := FreePort()
	pport, err2 := FreePort()
	if err1 != nil || err2 != nil {
		tb.Fatalf("etcdtest: free ports: %v %v", err1, err2)
	}
	p := &Process{
		Name:      name,
		ClientURL: "http://127.0.0.1:" + strconv.Itoa(cport),
		PeerURL:   "http://127.0.0.1:" + strconv.Itoa(pport),
		exited:    make(chan struct{}),
	}
	p.cmd = testpeer.Command(bin, append([]string{
		"--name", name, "--data-dir", tb.TempDir(),
		"--listen-client-urls", p.ClientURL, "--advertise-client-urls", p.ClientURL,
		"--listen-peer-urls", p.PeerURL, "--initial-advertise-peer-urls", p.PeerURL,
	}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("etcdtest: start %s: %v", bin, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if tb.Failed() {
			tb.Logf("etcd %s output:\n%s", name, p.Output())
		}
	})
	return p
}

// Write collects the process's output.
func (p *Process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

// Output returns what the process printed so far.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Exited is closed when the process has ended.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is the process's exit error (valid once Exited is closed).
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// WaitHealthy polls the member's /health until it reports a leader (an
// external process offers no event to wait on), failing the test if the
// process exits or the deadline passes.
func (p *Process) WaitHealthy(tb testing.TB, deadline time.Time) {
	tb.Helper()
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-p.exited:
			tb.Fatalf("etcd %s exited: %v", p.Name, p.Err())
		default:
		}
		if resp, err := client.Get(p.ClientURL + "/health"); err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(b.String(), `"health":"true"`) {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("etcd %s not healthy by the deadline", p.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
