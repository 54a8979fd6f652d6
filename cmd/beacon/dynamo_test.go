package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/internal/testkit/dynamotest"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/miekg/dns"
)

// padded is a Dynamo instance ID as Beacon shows it.
func padded(w *dynamotest.Worker) string { return beacon.FormatID(w.ID) }

// hasRow reports whether a table holds a row starting with these cells.
func hasRow(table string, cells ...string) bool {
	for line := range strings.Lines(table) {
		f := strings.Fields(line)
		if len(f) >= len(cells) && strings.Join(f[:len(cells)], " ") == strings.Join(cells, " ") {
			return true
		}
	}
	return false
}

// runBeacon runs a command to its end and returns it.
func runBeacon(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	b := startBeacon(t, t.TempDir(), env, args...)
	_ = b.wait(t, 60*time.Second)
	return b
}

// TestDynamoLayoutCLI points ls, watch, rm, register and dynamo explain at
// an etcd holding what Dynamo's workers write there (no Dynamo process
// runs): ls lists the instances with their models, watch follows a worker
// coming and its lease revoked or expiring, malformed entries are reported
// and skipped, writes are refused, explain says what a frontend sees.
func TestDynamoLayoutCLI(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{})
	ep := e.Endpoint()
	cli := e.Client(t)
	w1 := dynamotest.Start(t, cli, time.Minute, true)
	w1.Endpoint(t, "dynamo", "backend", "generate", dynamotest.TCP("10.0.0.5:9999", "generate"))
	w1.Endpoint(t, "dynamo", "backend", "clear_kv_blocks", dynamotest.TCP("10.0.0.5:9999", "clear_kv_blocks"))
	w1.Model(t, "dynamo", "backend", "generate", "Qwen/Qwen3-0.6B", "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "v1/instances/dynamo/backend/generate/2c", "garbage"); err != nil {
		t.Fatal(err)
	}

	ls := runBeacon(t, nil, "ls", "dynamo", "--layout", "dynamo", "--endpoints", ep)
	gen := "dynamo/backend/generate/" + padded(w1)
	if ls.exitCode() != 0 || !hasRow(ls.out(), gen, "10.0.0.5:9999", "tcp", "serving", "-") ||
		!strings.Contains(ls.out(), "dynamo.models=Qwen/Qwen3-0.6B") || !strings.Contains(ls.out(), "dynamo/backend/clear_kv_blocks/"+padded(w1)) {
		t.Fatalf("ls: %d\n%s%s", ls.exitCode(), ls.out(), ls.errOut())
	}
	if !strings.Contains(ls.errOut(), "v1/instances/dynamo/backend/generate/2c") || !strings.Contains(ls.errOut(), "not JSON") {
		t.Errorf("ls did not report the malformed entry:\n%s", ls.errOut())
	}
	if b := runBeacon(t, []string{"BEACON_LAYOUT=dynamo"}, "ls", "dynamo/backend/clear_kv_blocks", "-o", "json", "--endpoints", ep); b.exitCode() != 0 ||
		!strings.Contains(b.out(), `"dynamo.instance_id": "`) || strings.Contains(b.out(), "generate/") {
		t.Fatalf("ls with BEACON_LAYOUT: %d\n%s%s", b.exitCode(), b.out(), b.errOut())
	}

	watch := startBeacon(t, t.TempDir(), nil, "watch", "dynamo/backend/generate", "--layout", "dynamo", "--endpoints", ep)
	watch.waitLine(t, "synced   1 instance(s)", 30*time.Second)
	w2 := dynamotest.Start(t, cli, 2*time.Second, false) // a worker that dies: its lease expires
	w2.Endpoint(t, "dynamo", "backend", "generate", dynamotest.HTTP("10.0.0.6:8888", "generate"))
	watch.waitLine(t, "added   dynamo/backend/generate/"+padded(w2)+" 10.0.0.6:8888", 30*time.Second)
	w1.Revoke(t)
	watch.waitLine(t, "removed dynamo/backend/generate/"+padded(w1), 30*time.Second)
	watch.waitLine(t, "removed dynamo/backend/generate/"+padded(w2), 30*time.Second) // expired
	_ = watch.cmd.Process.Signal(syscall.SIGINT)
	_ = watch.wait(t, 30*time.Second)

	w3 := dynamotest.Start(t, cli, time.Minute, true)
	w3.Endpoint(t, "dynamo", "backend", "generate", dynamotest.TCP("10.0.0.7:9999", "generate"))
	w3.Model(t, "dynamo", "backend", "generate", "Qwen/Qwen3-0.6B", "")
	x := runBeacon(t, nil, "dynamo", "explain", "dynamo/backend/generate/"+w3.Hex(), "--endpoints", ep)
	if x.exitCode() != 0 || !strings.Contains(x.out(), "verdict: a Dynamo frontend would see this instance and route Qwen/Qwen3-0.6B requests to it") ||
		!strings.Contains(x.out(), "of 1m0s left") {
		t.Fatalf("explain of a live worker: %d\n%s%s", x.exitCode(), x.out(), x.errOut())
	}
	x = runBeacon(t, nil, "dynamo", "explain", "dynamo/backend/generate/"+w1.Hex(), "--endpoints", ep, "-o", "json")
	var got struct {
		Seen   bool           `json:"seen"`
		Checks []dynamo.Check `json:"checks"`
	}
	if err := json.Unmarshal([]byte(x.out()), &got); err != nil || x.exitCode() != exitFailure || got.Seen ||
		got.Checks[0].Check != "key" || got.Checks[0].Verdict != dynamo.Fail {
		t.Fatalf("explain of a revoked worker: %d %v\n%s%s", x.exitCode(), err, x.out(), x.errOut())
	}

	if b := runBeacon(t, nil, "register", "dynamo/backend/generate", "--addr", "10.0.0.1:80", "--layout", "dynamo", "--endpoints", ep); b.exitCode() != exitFailure ||
		!strings.Contains(b.errOut(), "read-only view") {
		t.Fatalf("register: %d\n%s", b.exitCode(), b.errOut())
	}
	if b := runBeacon(t, nil, "rm", "--yes", "dynamo/backend/generate/"+padded(w3), "--layout", "dynamo", "--endpoints", ep); b.exitCode() != exitUsage ||
		!strings.Contains(b.errOut(), "read-only view") {
		t.Fatalf("rm: %d\n%s", b.exitCode(), b.errOut())
	}
	checkBadInput(t, []badInput{
		{args: []string{"ls", "--layout", "v1", "--endpoints", ep}, want: `--layout "v1": want beacon or dynamo`},
		{args: []string{"ls", "--endpoints", ep}, env: []string{"BEACON_LAYOUT=Dynamo"}, want: `BEACON_LAYOUT="Dynamo"`},
		{args: []string{"ls", "--layout", "dynamo", "--root", "/beacon", "--endpoints", ep}, want: "which have no root"},
		{args: []string{"dynamo", "explain", "dynamo/backend/generate"}, want: "want namespace/component/endpoint/id"},
		{args: []string{"dynamo", "explain", "dynamo/backend/generate/2A"}, want: "not lower-case hex"},
	})
}

// TestServeDynamoLayout runs beacon serve in front of an etcd holding what
// Dynamo's workers write: the HTTP API lists them (a nested namespace
// too), DNS answers for them, every write is refused with 501.
func TestServeDynamoLayout(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{})
	cli := e.Client(t)
	w := dynamotest.Start(t, cli, time.Minute, true)
	w.Endpoint(t, "dynamo", "backend", "generate", dynamotest.TCP("10.0.0.5:9999", "generate"))
	w.Endpoint(t, "dynamo.tenant_1", "backend", "load_metrics", dynamotest.NATS("dynamo_backend.load_metrics-"+w.Hex()))
	w.Model(t, "dynamo", "backend", "generate", "Qwen/Qwen3-0.6B", "")
	httpURL, dnsAddr := freeURL(t), strings.TrimPrefix(freeURL(t), "http://")
	srv := startBeacon(t, t.TempDir(), []string{"BEACON_LAYOUT=dynamo"}, "serve", "--etcd-endpoints", e.Endpoint(),
		"--http-addr", strings.TrimPrefix(httpURL, "http://"), "--dns-addr", dnsAddr)
	srv.waitLine(t, "beacon serve is ready", 60*time.Second)
	get := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, httpURL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("GET", "/v1/registry/instances?namespace=dynamo", ""); code != 200 ||
		!strings.Contains(body, `"id":"`+padded(w)+`"`) || !strings.Contains(body, `"dynamo.models":"Qwen/Qwen3-0.6B"`) {
		t.Fatalf("list: %d %s", code, body)
	}
	if code, body := get("GET", "/v1/registry/instances?namespace=dynamo.tenant_1", ""); code != 200 ||
		!strings.Contains(body, `"address":"nats:///dynamo_backend.load_metrics-`+w.Hex()+`"`) {
		t.Fatalf("list of a nested namespace: %d %s", code, body)
	}
	if code, body := get("POST", "/v1/registry/instances", `{"namespace":"dynamo","component":"c","endpoint":"e","address":"10.0.0.1:80"}`); code != 501 ||
		!strings.Contains(body, "read-only view") {
		t.Fatalf("register over HTTP: %d %s", code, body)
	}
	// Ready means DNS answers from the registry's first snapshot, which
	// holds what the workers wrote before serve started.
	m := new(dns.Msg)
	m.SetQuestion("generate.backend.dynamo.beacon.", dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, dnsAddr)
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), "10.0.0.5") {
		t.Fatalf("DNS A generate.backend.dynamo: %v %v", r, err)
	}
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.wait(t, 30*time.Second); err != nil {
		t.Fatalf("serve: %v\n%s", err, srv.errOut())
	}
}

// Dynamo's names are bad usage of Beacon's own layout, as they always
// were: its writers never write them.
func TestDynamoNamesOutsideTheLayout(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{})
	checkBadInput(t, []badInput{
		{args: []string{"ls", "dynamo/backend/clear_kv_blocks", "--endpoints", e.Endpoint()}, want: `invalid endpoint "clear_kv_blocks": must be a DNS label`},
		{args: []string{"watch", "dynamo.t_1", "--endpoints", e.Endpoint()}, want: `invalid namespace "dynamo.t_1": must be a DNS label`},
	})
	if b := runBeacon(t, nil, "ls", "dynamo.t_1/backend/clear_kv_blocks", "--layout", "dynamo", "--endpoints", e.Endpoint()); b.exitCode() != 0 ||
		!strings.Contains(b.out(), "(no instances)") {
		t.Fatalf("ls of Dynamo's names in its layout: %d\n%s%s", b.exitCode(), b.out(), b.errOut())
	}
}
