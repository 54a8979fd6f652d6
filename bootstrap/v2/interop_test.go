package v2_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// startEtcd34 starts a Debian etcd 3.4 member that bootstraps through the
// v2 discovery URL.
func startEtcd34(t *testing.T, bin, name, discoveryURL string) *etcdtest.Process {
	t.Helper()
	return etcdtest.StartProcess(t, bin, name, "--discovery", discoveryURL, "--discovery-fallback", "exit",
		"--logger", "zap", "--log-level", "warn")
}

// Three real etcd 3.4 members bootstrap a cluster with
// --discovery=<Beacon's v2 service>/<token>, the service storing its
// tokens in a real etcd 3.7 through Beacon's etcd store; a fourth is told
// the cluster is full.
func TestEtcd34MembersBootstrapThroughV2Service(t *testing.T) {
	bin := testpeer.Binary(t, "apt-get install -y etcd-server (Debian's etcd 3.4, which still speaks v2 discovery)", "/usr/bin/etcd", "etcd")
	if out, err := testpeer.Command(bin, "--version").Output(); err != nil || !strings.Contains(string(out), "etcd Version: 3.4") {
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
	var members []*etcdtest.Process
	for i := 1; i <= 3; i++ {
		members = append(members, startEtcd34(t, bin, fmt.Sprintf("v%d", i), durl))
	}
	deadline := time.Now().Add(45 * time.Second)
	for _, m := range members {
		m.WaitHealthy(t, deadline)
	}

	// One cluster of three, whose member IDs are the registered keys.
	mcli, err := clientv3.New(clientv3.Config{Endpoints: []string{members[0].ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
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
	case <-late.Exited():
		if late.Err() == nil || !strings.Contains(late.Output(), "discovery: cluster is full") {
			t.Fatalf("fourth member: exit %v, output:\n%s", late.Err(), late.Output())
		}
	case <-ctx.Done():
		t.Fatal("fourth member did not exit")
	}
}
