package main

import (
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
)

// TestTokenCommands runs docs/bootstrap.md's walk-through against a real
// etcd registry: token new, status --watch while two `beacon serve` nodes
// join through the token, status as a table and as JSON, rm.
func TestTokenCommands(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{Name: "registry"})
	ep := srv.Endpoint()
	dir := t.TempDir()

	created := startBeacon(t, dir, nil, "token", "new", "--size", "2", "-o", "json", "--endpoints", ep)
	if err := created.wait(t, 30*time.Second); err != nil {
		t.Fatalf("token new: %v\n%s", err, created.errOut())
	}
	var resp bootstrap.CreateTokenResponse
	if err := json.Unmarshal([]byte(created.out()), &resp); err != nil || resp.Size != 2 || bootstrap.ValidateToken(resp.Token) != nil {
		t.Fatalf("token new -o json: %v\n%s", err, created.out())
	}
	tok := resp.Token

	watch := startBeacon(t, dir, nil, "token", "status", tok, "--watch", "--wait", "90s", "--endpoints", ep)
	watch.waitLine(t, "0 of 2 members registered", 30*time.Second)

	var nodes []*child
	for _, name := range []string{"n1", "n2"} {
		client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
		n := startBeacon(t, dir, nil, "serve", "--name", name, "--data-dir", name+".data",
			"--listen-client-urls", client, "--listen-peer-urls", peer, "--http-addr", strings.TrimPrefix(httpURL, "http://"),
			"--discovery-token", tok, "--discovery-endpoints", ep, "--dns-addr=")
		nodes = append(nodes, n)
	}
	watch.waitLine(t, "2 of 2 members registered", 60*time.Second)
	if err := watch.wait(t, 30*time.Second); err != nil {
		t.Fatalf("status --watch: %v\n%s", err, watch.errOut())
	}
	for _, want := range []string{"State:  full", "n1", "n2", "Initial cluster: "} {
		if !strings.Contains(watch.out(), want) {
			t.Fatalf("status --watch lacks %q:\n%s", want, watch.out())
		}
	}
	for _, n := range nodes {
		n.waitLine(t, "beacon serve is ready", 60*time.Second)
	}

	// A third node is refused with etcd's message, in one line.
	client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
	late := startBeacon(t, dir, nil, "serve", "--name", "n3", "--data-dir", "n3.data",
		"--listen-client-urls", client, "--listen-peer-urls", peer, "--http-addr", strings.TrimPrefix(httpURL, "http://"),
		"--discovery-token", tok, "--discovery-endpoints", ep, "--dns-addr=")
	if err := late.wait(t, 60*time.Second); err == nil || !strings.Contains(late.errOut(), "beacon: failed to join discovery cluster: discovery: cluster is full") {
		t.Fatalf("late node: %v\n%s", err, late.errOut())
	}

	st := startBeacon(t, dir, nil, "token", "status", tok, "-o", "json", "--endpoints", ep)
	if err := st.wait(t, 30*time.Second); err != nil {
		t.Fatalf("status: %v\n%s", err, st.errOut())
	}
	var status bootstrap.TokenStatusResponse
	if err := json.Unmarshal([]byte(st.out()), &status); err != nil || status.State != bootstrap.StateFull || status.Registered != 2 ||
		status.InitialCluster == "" {
		t.Fatalf("status -o json: %v\n%s", err, st.out())
	}

	// token rm asks first, on stderr; no answer or "n" keeps the token.
	tokenRm := func(stdin string, args ...string) *child {
		t.Helper()
		b := startBeaconIn(t, dir, nil, strings.NewReader(stdin), append([]string{"token", "rm", tok, "--endpoints", ep}, args...)...)
		_ = b.wait(t, 30*time.Second)
		return b
	}
	prompt := "Remove token " + tok + " (size 2, 2 registered, full)? Members still waiting on it will fail. [y/N]"
	if rm := tokenRm(""); rm.exitCode() != exitFailure || !strings.Contains(rm.errOut(), prompt) || !strings.Contains(rm.errOut(), "no answer") {
		t.Fatalf("rm with no answer: %d\n%s%s", rm.exitCode(), rm.out(), rm.errOut())
	}
	if rm := tokenRm("n\n"); rm.exitCode() != 0 || !strings.Contains(rm.out(), "kept token "+tok) {
		t.Fatalf("rm answered n: %d\n%s%s", rm.exitCode(), rm.out(), rm.errOut())
	}
	if rm := tokenRm("y\n"); rm.exitCode() != 0 || !strings.Contains(rm.errOut(), prompt) || !strings.Contains(rm.out(), "Removed token "+tok+" (6 keys)") {
		t.Fatalf("rm answered y: %d\n%s%s", rm.exitCode(), rm.out(), rm.errOut())
	}
	if rm := tokenRm("", "--yes"); rm.exitCode() != exitFailure || !strings.Contains(rm.errOut(), "token not found") {
		t.Fatalf("rm --yes of a removed token: %d\n%s%s", rm.exitCode(), rm.out(), rm.errOut())
	}
	gone := startBeacon(t, dir, nil, "token", "status", tok, "--endpoints", ep)
	if err := gone.wait(t, 30*time.Second); err == nil || !strings.Contains(gone.errOut(), "token not found") {
		t.Fatalf("status of a removed token: %v\n%s", err, gone.errOut())
	}
	for _, n := range nodes {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, n := range nodes {
		_ = n.wait(t, 60*time.Second)
	}
}

func TestTokenBadInput(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"token", "new", "--size", "0"}, want: "--size"},
		{args: []string{"token", "new", "--size", "-3"}, want: "--size"},
		{args: []string{"token", "new", "--size", "three"}, want: "--size"},
		{args: []string{"token", "rm", "a/b"}, want: "a/b"},
		{args: []string{"token", "new", "--token", "a/b"}, want: "a/b"},
		{args: []string{"token", "status", "a/b"}, want: "a/b"},
		{args: []string{"token", "status"}, want: ""},
		{args: []string{"token", "new", "-o", "yaml", "--endpoints", "http://127.0.0.1:1"}, want: "yaml"},
	})
}

// A full token whose members share a name cannot form a cluster:
// `beacon token status` must not say it can, in the State line or the
// IN CLUSTER column, and fails with the clash.
func TestTokenStatusDuplicateNameCannotForm(t *testing.T) {
	st := bootstrap.Status{Token: "t", Size: 2, State: bootstrap.StateFull, Members: []bootstrap.Member{
		{ID: "1", Name: "dup", PeerURLs: []string{"http://10.0.0.1:2380"}, Value: "dup=http://10.0.0.1:2380", Key: "/_etcd/registry/t/members/1", CreateRevision: 2},
		{ID: "2", Name: "dup", PeerURLs: []string{"http://10.0.0.2:2380"}, Value: "dup=http://10.0.0.2:2380", Key: "/_etcd/registry/t/members/2", CreateRevision: 3},
	}}
	var out strings.Builder
	err := printTokenStatus(&out, "table", st)
	if !errors.Is(err, bootstrap.ErrDuplicateName) {
		t.Fatalf("error %v, want %v", err, bootstrap.ErrDuplicateName)
	}
	if strings.Contains(out.String(), "can form") || strings.Contains(out.String(), " yes") ||
		!strings.Contains(out.String(), "State:  full: cannot form") || strings.Count(out.String(), "no (cannot form)") != 2 {
		t.Fatalf("status of a token that cannot form:\n%s", out.String())
	}
}
