package v2_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/internal/etcdtest"
	"github.com/beaconplane/beacon/internal/testpeer"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdProc is a running etcd 3.4 member (Debian's etcd-server).
type etcdProc struct {
	name, clientURL, peerURL string
	cmd                      *exec.Cmd
	mu                       sync.Mutex
	out                      bytes.Buffer
	exited                   chan struct{}
	err                      error
}

func (p *etcdProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *etcdProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// startEtcd34 starts a member that bootstraps through the v2 discovery URL.
func startEtcd34(t *testing.T, bin, name, discoveryURL string) *etcdProc {
	t.Helper()
	cport, err1 := etcdtest.FreePort()
	pport, err2 := etcdtest.FreePort()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	p := &etcdProc{
		name:      name,
		clientURL: "http://127.0.0.1:" + strconv.Itoa(cport),
		peerURL:   "http://127.0.0.1:" + strconv.Itoa(pport),
		exited:    make(chan struct{}),
	}
	p.cmd = exec.Command(bin,
		"--name", name, "--data-dir", t.TempDir(),
		"--listen-client-urls", p.clientURL, "--advertise-client-urls", p.clientURL,
		"--listen-peer-urls", p.peerURL, "--initial-advertise-peer-urls", p.peerURL,
		"--discovery", discoveryURL, "--discovery-fallback", "exit",
		"--logger", "zap", "--log-level", "warn")
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("etcd %s output:\n%s", name, p.log())
		}
	})
	return p
}

// waitHealthy polls the member's /health (etcd 3.4 offers no event to wait
// on) until it reports a leader, or fails the test at the deadline.
func (p *etcdProc) waitHealthy(t *testing.T, deadline time.Time) {
	t.Helper()
	for {
		select {
		case <-p.exited:
			t.Fatalf("etcd %s exited: %v", p.name, p.err)
		default:
		}
		resp, err := http.Get(p.clientURL + "/health")
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && strings.Contains(b.String(), `"health":"true"`) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd %s not healthy by the deadline", p.name)
		}
		time.Sleep(50 * time.Millisecond) // polling an external process: no event exists
	}
}

// Three real etcd 3.4 members bootstrap a cluster with
// --discovery=<Beacon's v2 service>/<token>, the service storing its
// tokens in a real etcd 3.7 through Beacon's etcd store; a fourth is told
// the cluster is full.
func TestEtcd34MembersBootstrapThroughV2Service(t *testing.T) {
	bin := testpeer.Binary(t, "apt-get install -y etcd-server (Debian's etcd 3.4, which still speaks v2 discovery)", "/usr/bin/etcd", "etcd")
	if out, err := exec.Command(bin, "--version").Output(); err != nil || !strings.Contains(string(out), "etcd Version: 3.4") {
		t.Fatalf("%s is not etcd 3.4 (v2 discovery was removed in 3.7): %s %v", bin, out, err)
	}
	registry := etcdtest.Start(t, etcdtest.Options{Name: "v2-registry"})
	cli := registry.Client(t)
	st := etcdstore.NewFromClient(cli)
	t.Cleanup(func() { _ = st.Close() })

	mux := http.NewServeMux()
	srv := newHTTPServer(t, mux)
	svc, err := v2.New(v2.Config{Store: st, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	mux.Handle("/", svc)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	token, err := svc.CreateToken(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	durl := svc.TokenURL(token)
	var members []*etcdProc
	for i := 1; i <= 3; i++ {
		members = append(members, startEtcd34(t, bin, fmt.Sprintf("v%d", i), durl))
	}
	deadline := time.Now().Add(45 * time.Second)
	for _, m := range members {
		m.waitHealthy(t, deadline)
	}

	// One cluster of three, whose member IDs are the registered keys.
	mcli, err := clientv3.New(clientv3.Config{Endpoints: []string{members[0].clientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer mcli.Close()
	ml, err := mcli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kvs, _, err := st.List(ctx, v2.DefaultPrefix+"tokens/"+token+"/")
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]string{}
	for _, kv := range kvs {
		id := strings.TrimPrefix(kv.Key, v2.DefaultPrefix+"tokens/"+token+"/")
		if !strings.HasPrefix(id, "_") {
			registered[id] = string(kv.Value)
		}
	}
	if len(ml.Members) != 3 || len(registered) != 3 {
		t.Fatalf("members %v, registered %v", ml.Members, registered)
	}
	for _, m := range ml.Members {
		v, ok := registered[strconv.FormatUint(m.ID, 16)]
		if !ok || v != m.Name+"="+m.PeerURLs[0] {
			t.Fatalf("member %s (%x, %v) is not registered as such: %v", m.Name, m.ID, m.PeerURLs, registered)
		}
	}
	if _, err := mcli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("write to the new cluster: %v", err)
	}

	late := startEtcd34(t, bin, "v4", durl)
	select {
	case <-late.exited:
		if late.err == nil || !strings.Contains(late.log(), "discovery: cluster is full") {
			t.Fatalf("fourth member: exit %v, output:\n%s", late.err, late.log())
		}
	case <-ctx.Done():
		t.Fatal("fourth member did not exit")
	}
}
