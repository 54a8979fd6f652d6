package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/kubetest"
)

// TestKubernetesBackend runs the registry commands and beacon serve with
// --backend kubernetes against a real control plane: a worker "pod"
// registers (identity from POD_* as the Downward API gives it), watch and ls
// see it once the pod is Ready, DYN_DISCOVERY_BACKEND=kubernetes works as an
// alias, beacon serve lists it over HTTP and refuses registration over HTTP
// (501), and bad input fails with one clear line.
func TestKubernetesBackend(t *testing.T) {
	cp := kubetest.New(t, kubetest.Options{})
	ns := cp.Namespace(t)
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := kubetest.WriteKubeconfig(kc, cp.Admin(), ns); err != nil {
		t.Fatal(err)
	}
	kube := []string{"--backend", "kubernetes", "--kubeconfig", kc}
	pod := cp.Pod(t, ns, "worker")
	// CONTAINER_NAME empty: pod mode, whatever the environment the test
	// runs in sets.
	podEnv := []string{"POD_NAME=" + pod.Name, "POD_NAMESPACE=" + ns, "POD_UID=" + string(pod.UID), "CONTAINER_NAME="}

	w := startBeacon(t, dir, nil, append([]string{"watch", "demo"}, kube...)...)
	w.waitLine(t, "synced   0 instance(s)", 60*time.Second)

	reg := startBeacon(t, dir, podEnv, append([]string{"register", "demo/api/http", "--addr", "10.0.0.5:8080"}, kube...)...)
	line := reg.waitLine(t, "registered demo/api/http/", 60*time.Second)
	id := regexp.MustCompile(`demo/api/http/([0-9a-f]{16})`).FindStringSubmatch(line)[1]
	// The pod has no IP and is not Ready yet: register says why watchers
	// do not see the instance.
	reg.waitLine(t, "registered, but not visible to watchers: pod "+ns+"/worker is in no EndpointSlice", 30*time.Second)
	cp.SetReady(t, pod, true)
	if added := w.waitLine(t, "added", 60*time.Second); !strings.Contains(added, id) {
		t.Fatalf("watch printed %q", added)
	}
	reg.waitLine(t, "visible to watchers now", 30*time.Second)

	ls := startBeacon(t, dir, []string{"DYN_DISCOVERY_BACKEND=kubernetes", "KUBECONFIG=" + kc}, "ls", "demo", "-o", "json")
	if err := ls.wait(t, 60*time.Second); err != nil {
		t.Fatalf("ls: %v\n%s", err, ls.errOut())
	}
	var listing struct {
		Revision  int64 `json:"revision"`
		Instances []struct {
			ID string `json:"id"`
		} `json:"instances"`
	}
	if err := json.Unmarshal([]byte(ls.out()), &listing); err != nil || len(listing.Instances) != 1 || listing.Instances[0].ID != id {
		t.Fatalf("ls -o json = %s (%v)", ls.out(), err)
	}

	httpURL, xdsAddr := freeURL(t), strings.TrimPrefix(freeURL(t), "http://")
	srv := startBeacon(t, dir, nil, append([]string{"serve", "--http-addr", strings.TrimPrefix(httpURL, "http://"),
		"--dns-addr", "127.0.0.1:0", "--xds-addr", xdsAddr}, kube...)...)
	srv.waitLine(t, "beacon serve is ready (kubernetes)", 60*time.Second)
	if e := srv.errOut(); strings.Count(e, "health checks off") != 1 || !strings.Contains(e, `missing="POD_NAME, POD_NAMESPACE, POD_UID"`) {
		t.Fatalf("serve outside a pod: want one log line saying why health checks are off, got:\n%s", e)
	}
	// xDS serves the Kubernetes registry as any other.
	get := startBeacon(t, dir, nil, "xds", "get", "--server", xdsAddr, "--type", "endpoint", "http.api.demo")
	if err := get.wait(t, 30*time.Second); err != nil || !strings.Contains(get.out(), `"address": "10.0.0.5"`) ||
		!strings.Contains(get.out(), `"portValue": 8080`) {
		t.Fatalf("xds get: %v\n%s%s", err, get.out(), get.errOut())
	}
	for path, want := range map[string]int{"/readyz": 200, "/v1/registry/instances?namespace=demo": 200} {
		resp, err := http.Get(httpURL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (strings.Contains(path, "instances") && !strings.Contains(string(body), id)) {
			t.Fatalf("GET %s = %d %s", path, resp.StatusCode, body)
		}
	}
	resp, err := http.Post(httpURL+"/v1/registry/instances", "application/json",
		strings.NewReader(`{"namespace":"demo","component":"web","endpoint":"http","address":"10.0.0.9:80","ttl":"10s"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("registration over HTTP on kubernetes: %d, want 501", resp.StatusCode)
	}
	// Operator actions need the registry's capability too.
	for _, action := range []string{"drain", "deregister"} {
		resp, err := http.Post(httpURL+"/v1/registry/instances/demo/api/http/"+id+"/"+action, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotImplemented || !strings.Contains(string(body), "drain from the registering process") {
			t.Fatalf("operator %s on kubernetes: %d %s, want 501 saying how to drain", action, resp.StatusCode, body)
		}
	}
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.wait(t, 30*time.Second); err != nil {
		t.Fatalf("serve: %v\n%s", err, srv.errOut())
	}

	_ = reg.cmd.Process.Signal(syscall.SIGINT)
	reg.waitLine(t, "deregistered demo/api/http/"+id, 30*time.Second)
	if err := reg.wait(t, 30*time.Second); err != nil {
		t.Fatalf("register: %v\n%s", err, reg.errOut())
	}
	if removed := w.waitLine(t, "removed", 30*time.Second); !strings.Contains(removed, id) {
		t.Fatalf("watch printed %q", removed)
	}

	kubeHealthChecks(t, cp, ns, dir, kube, w, podEnv)

	checkBadInputEnv(t, []string{"KUBECONFIG=" + kc}, []badInput{
		{args: []string{"serve", "--backend", "kubernetes", "--health-checks", "--http-addr", "127.0.0.1:0", "--dns-addr", "127.0.0.1:0"},
			want: "--health-checks: cannot run the health checker over the kubernetes backend: health: invalid checker configuration: Config.Registry: kube: no pod identity: POD_NAME, POD_NAMESPACE, POD_UID are not set"},
		{args: []string{"register", "demo/api/http", "--addr", "10.0.0.1:80", "--backend", "kubernetes"}, want: "POD_NAME, POD_NAMESPACE, POD_UID are not set"},
		{args: []string{"register", "demo/api/http", "--addr", "10.0.0.1:80", "--backend", "kubernetes", "--ttl", "5s"}, want: "no lease"},
		{args: []string{"ls", "--backend", "kubernetes", "--kubeconfig", filepath.Join(dir, "nope")}, want: `--kubeconfig "` + filepath.Join(dir, "nope") + `": no such file`},
		{args: []string{"ls", "--backend", "kubernetes", "--kube-namespaces", "*,x"}, want: `"*" means every namespace`},
		{args: []string{"ls", "--backend", "kubernetes", "--root", "/beacon"}, want: "does not apply"},
	})
}

// checkBadInputEnv is checkBadInput with extra environment.
func checkBadInputEnv(t *testing.T, env []string, tests []badInput) {
	t.Helper()
	for _, tt := range tests {
		b := startBeacon(t, t.TempDir(), env, tt.args...)
		if err := b.wait(t, 60*time.Second); err == nil {
			t.Errorf("%v: exit status 0", tt.args)
			continue
		}
		stderr := strings.TrimSpace(b.errOut())
		if !strings.Contains(stderr, tt.want) || !strings.HasPrefix(stderr, "beacon: ") || strings.Contains(stderr, "\n") {
			t.Errorf("%v: stderr %q, want one 'beacon: ' line containing %q", tt.args, stderr, tt.want)
		}
	}
}

// kubeHealthChecks: beacon serve in a pod of its own (the pod identity
// set) runs a health checker by default; an instance registered with
// --check tcp is probed, and its verdict reaches `beacon watch`; the
// checker stopped, its verdicts go (the instance is unknown again).
func kubeHealthChecks(t *testing.T, cp *kubetest.ControlPlane, ns, dir string, kube []string, w *child, workerEnv []string) {
	t.Helper()
	reg := startBeacon(t, dir, workerEnv, append([]string{"register", "demo/web/tcp", "--addr", listenAndClose(t), "--check", "tcp",
		"--check-interval", "500ms", "--check-rise", "1", "--check-fall", "1"}, kube...)...)
	reg.waitLine(t, "registered demo/web/tcp/", 60*time.Second)
	w.waitLine(t, "health=unknown", 60*time.Second)
	pod := cp.ReadyPod(t, ns, "checker")
	env := []string{"POD_NAME=" + pod.Name, "POD_NAMESPACE=" + pod.Namespace, "POD_UID=" + string(pod.UID), "CONTAINER_NAME="}
	srv := startBeacon(t, dir, env, append([]string{"serve", "--http-addr", "127.0.0.1:0", "--dns-addr", "127.0.0.1:0",
		"--health-checker-id", "checker-1"}, kube...)...)
	srv.waitLine(t, "beacon serve is ready (kubernetes)", 60*time.Second)
	if l := w.waitLine(t, "health=passing", 60*time.Second); !strings.Contains(l, "demo/web/tcp/") {
		t.Fatalf("watch printed %q", l)
	}
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.wait(t, 30*time.Second); err != nil {
		t.Fatalf("serve: %v\n%s", err, srv.errOut())
	}
	if l := w.waitLine(t, "health=unknown", 30*time.Second); !strings.Contains(l, "demo/web/tcp/") {
		t.Fatalf("watch printed %q", l)
	}
	_ = reg.cmd.Process.Signal(syscall.SIGINT)
	if err := reg.wait(t, 30*time.Second); err != nil {
		t.Fatalf("register: %v\n%s", err, reg.errOut())
	}
}
