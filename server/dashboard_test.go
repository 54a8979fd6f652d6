package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
)

func getCluster(t *testing.T, base string) ClusterStatus {
	t.Helper()
	code, body := get(t, base+ClusterPath)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d %s", ClusterPath, code, body)
	}
	var st ClusterStatus
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("GET %s: %v: %s", ClusterPath, err, body)
	}
	return st
}

// TestClusterAPIReportsEtcdMembers fronts a real 3-member etcd cluster:
// the API lists the members with one leader and their raft and database
// status, then reports a stopped member unhealthy while the others stay
// healthy.
func TestClusterAPIReportsEtcdMembers(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cfg := Config{HTTPAddr: "127.0.0.1:0", EtcdEndpoints: c.Endpoints()}
	s := startServer(t, cfg)

	st := getCluster(t, s.Endpoints().HTTP)
	if st.Backend != "etcd" || !strings.HasPrefix(st.Description, "external etcd at ") || st.Health.Status != "ok" {
		t.Errorf("backend %q %q health %+v", st.Backend, st.Description, st.Health)
	}
	if st.Etcd == nil || len(st.Etcd.Members) != 3 || st.Etcd.ClusterID == "" || st.Etcd.Leader == "" {
		t.Fatalf("etcd: %+v", st.Etcd)
	}
	leaders := 0
	for _, m := range st.Etcd.Members {
		if m.Leader {
			leaders++
		}
		if !m.Healthy || m.Health != "ok" || m.RaftTerm == 0 || m.RaftIndex == 0 || m.DBSize == 0 || m.Revision == 0 ||
			m.Version == "" || len(m.PeerURLs) != 1 || len(m.ClientURLs) != 1 || m.Name == "" {
			t.Errorf("member %+v", m)
		}
	}
	if leaders != 1 {
		t.Errorf("%d leaders", leaders)
	}
	if st.Session == nil || st.Session.State != "idle" || !st.Features.DiscoveryTokens || !st.Features.HTTPRegistration {
		t.Errorf("session %+v features %+v", st.Session, st.Features)
	}

	// Stop a follower: it is reported unhealthy (within the per-member
	// timeout), the others healthy, with the same leader.
	var stopped string
	for _, m := range c.Members() {
		for _, sm := range st.Etcd.Members {
			if sm.Name == m.Name && !sm.Leader && stopped == "" {
				m.Stop()
				stopped = m.Name
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	after := s.clusterStatus(ctx) // uncached
	t.Logf("status with a stopped member took %v", time.Since(start))
	if time.Since(start) > memberStatusTimeout+time.Second {
		t.Errorf("a stopped member held the status for %v", time.Since(start))
	}
	for _, m := range after.Etcd.Members {
		switch {
		case m.Name == stopped && (m.Healthy || !strings.HasPrefix(m.Health, "did not answer")):
			t.Errorf("stopped member %s: %+v", m.Name, m)
		case m.Name != stopped && !m.Healthy:
			t.Errorf("running member %s unhealthy: %s", m.Name, m.Health)
		}
	}
	if after.Etcd.Leader != st.Etcd.Leader {
		t.Errorf("leader %s, was %s", after.Etcd.Leader, st.Etcd.Leader)
	}
}

func TestClusterAPIWithoutEtcd(t *testing.T) {
	s := startServer(t, Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}})
	st := getCluster(t, s.Endpoints().HTTP)
	if st.Backend != "memory" || st.Etcd != nil || st.Health.Status != "ok" || st.Features.DiscoveryTokens || !st.Features.HTTPRegistration {
		t.Errorf("%+v", st)
	}
}

func TestClusterAPIRefusesWritesAndParameters(t *testing.T) {
	s := startServer(t, Config{HTTPAddr: "127.0.0.1:0", Backend: backend.Config{Name: backend.Memory}})
	base := s.Endpoints().HTTP
	req, err := http.NewRequest(http.MethodPost, base+ClusterPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("POST = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if code, body := get(t, base+ClusterPath+"?x=1"); code != http.StatusBadRequest || !strings.Contains(body, "invalid_argument") {
		t.Errorf("GET ?x=1 = %d %s", code, body)
	}
	// The dashboard is there, and / leads to it.
	if code, body := get(t, base+"/"); code != http.StatusOK || !strings.Contains(body, "/ui/assets/js/main.js") {
		t.Errorf("GET / = %d", code)
	}
	if code, _ := get(t, base+"/no-such-route"); code != http.StatusNotFound {
		t.Errorf("GET /no-such-route = %d, want 404 (only / itself redirects)", code)
	}
	// A page takes links with others' parameters (a mail's utm_source):
	// the dashboard, unlike the API, ignores what it does not know, and
	// refuses only a query that cannot be parsed.
	for _, path := range []string{"/?utm_source=mail", "/ui/?utm_source=mail&q=api", "/ui/events?x=1&x=2", "/ui/?status=anything"} {
		if code, body := get(t, base+path); code != http.StatusOK || !strings.Contains(body, "/ui/assets/js/main.js") {
			t.Errorf("GET %s = %d, want the page", path, code)
		}
	}
	if code, body := get(t, base+"/ui/?q=%zz"); code != http.StatusBadRequest || !strings.Contains(body, "invalid_argument") {
		t.Errorf("GET /ui/?q=%%zz = %d %s, want 400", code, body)
	}
}

func TestRoutedSeesTheMuxRoutes(t *testing.T) {
	mux := http.NewServeMux()
	if routed(mux, http.MethodGet, whoAmIPath) {
		t.Errorf("an empty mux routes %s", whoAmIPath)
	}
	mux.HandleFunc("GET "+whoAmIPath, func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc(tokensPath, func(http.ResponseWriter, *http.Request) {})
	if !routed(mux, http.MethodGet, whoAmIPath) || routed(mux, http.MethodGet, "/v1/auth/other") {
		t.Errorf("routed does not follow the mux")
	}
	// A route for any method may refuse GET: it does not count.
	if routed(mux, http.MethodGet, tokensPath) {
		t.Errorf("routed counts a route of any method")
	}
}

// TestClusterAPIOfEmbeddedMembers asks one of three `beacon serve` nodes
// forming an embedded etcd cluster: it answers its own status from its
// etcd server and asks the two others over their client URLs.
func TestClusterAPIOfEmbeddedMembers(t *testing.T) {
	registry := startServer(t, testConfig(t))
	created := createToken(t, registry, 3)
	servers := startServers(t, discoveryConfig(t, "m1", created), discoveryConfig(t, "m2", created), discoveryConfig(t, "m3", created))
	st := getCluster(t, servers[0].Endpoints().HTTP)
	if st.Etcd == nil || len(st.Etcd.Members) != 3 || st.Etcd.Leader == "" {
		t.Fatalf("etcd: %+v", st.Etcd)
	}
	leaders := 0
	for _, m := range st.Etcd.Members {
		if m.Leader {
			leaders++
		}
		if !m.Healthy || m.RaftTerm == 0 || m.Revision == 0 || m.DBSize == 0 {
			t.Errorf("member %s: %+v", m.Name, m)
		}
	}
	if leaders != 1 {
		t.Errorf("%d leaders", leaders)
	}
}
