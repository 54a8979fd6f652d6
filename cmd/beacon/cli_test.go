package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/natstest"
	"github.com/beaconplane/beacon/proxy"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	filestore "github.com/beaconplane/beacon/store/file"
	natsstore "github.com/beaconplane/beacon/store/nats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestUsageAndFailuresExitDifferently: bad usage exits 2, a failure at
// run time 1; an unknown subcommand is an error (with a suggestion), not
// help with exit 0; errors are one line without "beacon: beacon:".
func TestUsageAndFailuresExitDifferently(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"token", "stauts"}, want: `unknown command "stauts" for "beacon token" (did you mean "status"?)`},
		{args: []string{"stauts"}, want: `unknown command "stauts" for "beacon"`},
		{args: []string{"bench", "nope"}, want: `unknown command "nope" for "beacon bench"`},
		// cobra's own commands, added when it executes, follow the same habits.
		{args: []string{"completion", "powershel"}, want: `unknown command "powershel" for "beacon completion" (did you mean "powershell"?)`},
		{args: []string{"completion", "bash", "extra"}, want: `unknown command "extra" for "beacon completion bash"`},
		{args: []string{"help", "stauts"}, want: `unknown command "stauts" for "beacon"`},
		{args: []string{"help", "token", "stauts"}, want: `unknown command "stauts" for "beacon token" (did you mean "status"?)`},
		{args: []string{"ls", "--no-such-flag"}, want: "unknown flag"},
		{args: []string{"ls", ""}, want: "the query argument is empty"},
		{args: []string{"watch", ""}, want: "the query argument is empty"},
		{args: []string{"token", "status"}, want: "accepts 1 arg"},
		{args: []string{"register", "prod/api/http"}, want: `required flag(s) "addr" not set`},
		{args: []string{"register", "Prod/api/http", "--addr", "10.0.0.1:80"}, want: "invalid namespace"},
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "--id", "XYZ"}, want: "--id: invalid instance id"},
		{args: []string{"ls", "--endpoints", freeURL(t), "--dial-timeout", "500ms"}, want: "refused", exit: exitFailure},
	})
	group := startBeacon(t, t.TempDir(), nil, "token")
	if err := group.wait(t, 30*time.Second); err != nil || !strings.Contains(group.out(), "Available Commands") {
		t.Fatalf("beacon token without a subcommand: %v, want its help and exit 0\n%s", err, group.out())
	}
}

// TestSettingsCheckedByEveryCommand: --log-level and --log-format (and
// their variables) are checked by every command before it does anything,
// and the error names the flag or the variable that was wrong.
func TestSettingsCheckedByEveryCommand(t *testing.T) {
	setup(rootCmd)
	// Arguments that get each command past its own checks.
	args := map[string][]string{
		"beacon register":             {"prod/api/http", "--addr", "10.0.0.1:80"},
		"beacon rm":                   {"prod/api/http/00000000000000a1"},
		"beacon token status":         {"tok"},
		"beacon token rm":             {"tok"},
		"beacon auth grant-namespace": {"writers", "team-a"},
		"beacon auth grant-bootstrap": {"admins"},
		"beacon dynamo explain":       {"dynamo/backend/generate/2a"},
	}
	var tests []badInput
	walk(rootCmd, func(c *cobra.Command) {
		if c.HasSubCommands() || !c.Runnable() || c.Name() == "help" {
			return
		}
		line := append(strings.Fields(strings.TrimPrefix(c.CommandPath(), "beacon ")), args[c.CommandPath()]...)
		tests = append(tests,
			badInput{args: append(append([]string{}, line...), "--log-level", "loud"), want: `--log-level "loud": must be debug, info, warn or error`},
			badInput{args: append(append([]string{}, line...), "--log-format", "yaml"), want: `--log-format "yaml": must be text or json`},
			badInput{args: line, env: []string{"BEACON_LOG_LEVEL=loud"}, want: `BEACON_LOG_LEVEL="loud"`},
		)
	})
	if len(tests) < 30 {
		t.Fatalf("only %d command lines: the command tree was not walked", len(tests))
	}
	checkBadInput(t, tests)
}

// TestEmptyFlagValuesAreRefused: every string or list flag of every
// command given an empty value is bad usage naming the flag, unless it is
// marked as taking one on purpose (--dns-addr=: no DNS): `--endpoints ""`
// used localhost, `serve --etcd-endpoints "$UNSET"` ran embedded etcd and
// `--data-dir ""` put the data somewhere unsaid, all without a word.
func TestEmptyFlagValuesAreRefused(t *testing.T) {
	setup(rootCmd)
	n := 0
	walk(rootCmd, func(c *cobra.Command) {
		c.Flags().VisitAll(func(fl *pflag.Flag) {
			sv, isSlice := fl.Value.(pflag.SliceValue)
			if !isSlice && fl.Value.Type() != "string" {
				return
			}
			orig, origItems, changed := fl.Value.String(), []string(nil), fl.Changed
			if isSlice {
				origItems = sv.GetSlice()
			}
			if err := c.Flags().Set(fl.Name, ""); err != nil {
				return // refused by the flag itself (a list of numbers): bad usage
			}
			err := checkEmptyFlags(c)
			if isSlice {
				_ = sv.Replace(origItems)
			} else {
				_ = fl.Value.Set(orig)
			}
			fl.Changed = changed
			n++
			if len(fl.Annotations[emptyMeans]) > 0 {
				if err != nil {
					t.Errorf("%s --%s= (allowed empty): %v", c.CommandPath(), fl.Name, err)
				}
				return
			}
			if want := fmt.Sprintf("--%s \"\": empty", fl.Name); err == nil || exitCode(err) != exitUsage || !strings.Contains(err.Error(), want) {
				t.Errorf("%s --%s=: %v, want bad usage saying %q", c.CommandPath(), fl.Name, err, want)
			}
		})
	})
	if n < 100 {
		t.Fatalf("only %d flags checked: the command tree was not walked", n)
	}
	// End to end, and the variables: blanks are no endpoint either.
	checkBadInput(t, []badInput{
		{args: []string{"ls", "--endpoints", ""}, want: `--endpoints "": empty (an unset variable?): give a value, or leave it out for its default, http://localhost:2379`},
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80", "--endpoints", "http://127.0.0.1:1,"}, want: `--endpoints "http://127.0.0.1:1,": empty`},
		{args: []string{"serve", "--etcd-endpoints", ""}, want: `--etcd-endpoints "": empty`},
		{args: []string{"serve", "--data-dir", ""}, want: `--data-dir "": empty`},
		{args: []string{"proxy", "--endpoints", ""}, want: `--endpoints "": empty`},
		{args: []string{"ls"}, env: []string{"ETCD_ENDPOINTS= "}, want: `ETCD_ENDPOINTS=" ": no endpoint in it`},
	})
}

// TestZeroFlagValuesAreRefused: every numeric flag of every command given
// 0 is bad usage naming the flag, unless it is marked as taking 0 (and its
// help says what 0 means): `--proxy-refresh-interval 0`, `--max-watches 0`
// or `--shutdown-timeout 0` silently meant the default.
func TestZeroFlagValuesAreRefused(t *testing.T) {
	setup(rootCmd)
	n := 0
	walk(rootCmd, func(c *cobra.Command) {
		c.Flags().VisitAll(func(fl *pflag.Flag) {
			if !numericFlag(fl) || zeroUnchecked[fl.Name] {
				return
			}
			orig, changed := fl.Value.String(), fl.Changed
			if err := c.Flags().Set(fl.Name, "0"); err != nil {
				t.Errorf("%s --%s 0: %v", c.CommandPath(), fl.Name, err)
				return
			}
			err := checkZeroFlags(c)
			_ = fl.Value.Set(orig)
			fl.Changed = changed
			n++
			if m := fl.Annotations[zeroMeans]; len(m) > 0 {
				if err != nil {
					t.Errorf("%s --%s 0 (allowed: %s): %v", c.CommandPath(), fl.Name, m[0], err)
				}
				if !strings.Contains(fl.Usage, "0") {
					t.Errorf("%s --%s: 0 means %q, which its help does not say: %q", c.CommandPath(), fl.Name, m[0], fl.Usage)
				}
				return
			}
			if want := "--" + fl.Name + " 0"; err == nil || exitCode(err) != exitUsage || !strings.Contains(err.Error(), want) {
				t.Errorf("%s --%s 0: %v, want bad usage saying %q", c.CommandPath(), fl.Name, err, want)
			}
		})
	})
	if n < 60 {
		t.Fatalf("only %d flags checked: the command tree was not walked", n)
	}
	checkBadInput(t, []badInput{
		{args: []string{"proxy", "--proxy-refresh-interval", "0"}, want: `--proxy-refresh-interval 0s: 0 is not a value of this flag`},
		{args: []string{"proxy", "--proxy-failure-wait", "0"}, want: `--proxy-failure-wait 0s: 0 is not a value of this flag`},
		{args: []string{"proxy", "--max-watchers", "0"}, want: `--max-watchers 0: 0 is not a value of this flag (not "none", "never" nor "no limit"): give a positive value, or leave it out for its default, 100000; -1 for no limit`},
		{args: []string{"proxy", "--proxy-write-timeout", "-1s"}, want: `--proxy-write-timeout -1s: must not be negative`},
		{args: []string{"proxy", "--start-timeout", "-5"}, want: `--start-timeout -5ms: must not be negative`},
		{args: []string{"serve", "--shutdown-timeout", "0s"}, want: `--shutdown-timeout 0s: 0 is not a value of this flag`},
		{args: []string{"serve", "--max-watches", "0"}, want: `--max-watches 0: 0 is not a value of this flag`},
	})
}

// TestProxyDurationsZero: the proxy's 0s that mean something get that
// meaning, not the configuration's default (--proxy-write-timeout 0 was a
// 5 s bound, --start-timeout 0 a 30 s one).
func TestProxyDurationsZero(t *testing.T) {
	cmd := newProxyCmd()
	if err := cmd.Flags().Parse([]string{"--proxy-write-timeout", "0", "--start-timeout", "0", "--proxy-read-timeout", "0"}); err != nil {
		t.Fatal(err)
	}
	cfg := proxy.Config{WriteTimeout: 0, StartTimeout: 0}
	if err := proxyDurations(cmd.Flags(), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.WriteTimeout >= 0 || cfg.StartTimeout >= 0 || cfg.ReadTimeout != 0 {
		t.Fatalf("write timeout %v, start timeout %v, read timeout %v: want disabled, no bound, disabled", cfg.WriteTimeout, cfg.StartTimeout, cfg.ReadTimeout)
	}
}

// TestAuthGrantWarnsWithoutAuth: granting on an etcd without
// authentication works (roles can be prepared before enabling it) but
// says that nothing checks them yet; it said nothing. With authentication
// on, no warning. A role name with control characters or spaces is bad
// usage.
func TestAuthGrantWarnsWithoutAuth(t *testing.T) {
	open := etcdtest.Start(t, etcdtest.Options{})
	for _, args := range [][]string{{"grant-namespace", "team-a-writer", "team-a"}, {"grant-bootstrap", "admins"}} {
		b := startBeacon(t, t.TempDir(), nil, append(append([]string{"auth"}, args...), "--endpoints", open.Endpoint())...)
		if err := b.wait(t, 30*time.Second); err != nil {
			t.Fatalf("auth %v: %v\n%s", args, err, b.errOut())
		}
		if !strings.Contains(b.errOut(), "warning: etcd authentication is not enabled on this cluster") {
			t.Errorf("auth %v without etcd authentication: no warning:\n%s", args, b.errOut())
		}
	}
	secured := etcdtest.Start(t, etcdtest.Options{User: "root", Password: "s3cret"})
	b := startBeacon(t, t.TempDir(), nil, "auth", "grant-namespace", "team-a-writer", "team-a", "--endpoints", secured.Endpoint(), "--user", "root:s3cret")
	if err := b.wait(t, 30*time.Second); err != nil || strings.Contains(b.errOut(), "warning") {
		t.Fatalf("auth grant-namespace with etcd authentication: %v\n%s", err, b.errOut())
	}
	checkBadInput(t, []badInput{
		{args: []string{"auth", "grant-namespace", "team\nwriter", "team-a"}, want: `ROLE "team\nwriter": want a name of printable characters without spaces`},
		{args: []string{"auth", "grant-bootstrap", "ad mins"}, want: `ROLE "ad mins"`},
	})
}

// TestEnvironmentErrorsNameTheVariable: a bad value from a variable is
// reported under the variable's name, not the flag's.
func TestEnvironmentErrorsNameTheVariable(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"register", "prod/api/http", "--addr", "10.0.0.1:80"}, env: []string{"BEACON_LEASE_TTL=2h"}, want: `BEACON_LEASE_TTL="2h"`},
		{args: []string{"ls"}, env: []string{"ETCDCTL_ENDPOINTS=etcd:notaport"}, want: `ETCDCTL_ENDPOINTS="etcd:notaport"`},
		{args: []string{"ls"}, env: []string{"ETCD_ENDPOINTS=ftp://etcd:2379"}, want: `ETCD_ENDPOINTS="ftp://etcd:2379"`},
		{args: []string{"ls", "--endpoints", "ftp://etcd:2379"}, want: `--endpoints "ftp://etcd:2379"`},
		{args: []string{"ls"}, env: []string{"ETCDCTL_DIAL_TIMEOUT=soon"}, want: `ETCDCTL_DIAL_TIMEOUT="soon"`},
		{args: []string{"ls"}, env: []string{"ETCDCTL_COMMAND_TIMEOUT=-1s"}, want: `ETCDCTL_COMMAND_TIMEOUT="-1s"`},
		{args: []string{"ls"}, env: []string{"ETCDCTL_WRITE_OUT=fields"}, want: `ETCDCTL_WRITE_OUT="fields"`},
		{args: []string{"ls"}, env: []string{"ETCDCTL_CACERT=/no/such/ca.pem"}, want: `ETCDCTL_CACERT="/no/such/ca.pem": no such file`},
		{args: []string{"ls"}, env: []string{"ETCDCTL_USER=root"}, want: `ETCDCTL_USER="root" has no password`},
		{args: []string{"ls"}, env: []string{"BEACON_DISCOVERY_BACKEND=zookeeper"}, want: `BEACON_DISCOVERY_BACKEND="zookeeper": unknown backend`},
		{args: []string{"serve"}, env: []string{"BEACON_DISCOVERY_BACKEND=zookeeper"}, want: `BEACON_DISCOVERY_BACKEND="zookeeper"`},
		{args: []string{"proxy"}, env: []string{"BEACON_PROXY_MODE=readmostly"}, want: `BEACON_PROXY_MODE="readmostly"`},
		{args: []string{"proxy"}, env: []string{"BEACON_PROXY_LISTEN=23790"}, want: `BEACON_PROXY_LISTEN="23790": is a bare port: give host:port`},
		{args: []string{"proxy"}, env: []string{"BEACON_PROXY_LISTEN=:99999"}, want: `BEACON_PROXY_LISTEN=":99999": must be host:port: port "99999" is not a number from 0 to 65535`},
		{args: []string{"ls", "--backend", "file"}, want: "BEACON_FILE_DIR"},
		{args: []string{"ls"}, env: []string{"BEACON_LOG_FORMAT=yaml"}, want: `BEACON_LOG_FORMAT="yaml"`},
	})
	// A TLS file that exists but holds no certificate is bad usage too, named
	// as given: the store named its own variable (ETCD_AUTH_CA) for
	// --cacert and --etcd-cacert, and the command exited 1.
	notPEM := t.TempDir() + "/not.pem"
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dead := freeURL(t)
	checkBadInput(t, []badInput{
		{args: []string{"ls", "--cacert", notPEM, "--endpoints", dead}, want: `--cacert "` + notPEM + `" holds no PEM certificate`},
		{args: []string{"ls", "--endpoints", dead}, env: []string{"ETCDCTL_CACERT=" + notPEM}, want: `ETCDCTL_CACERT="` + notPEM + `" holds no PEM certificate`},
		{args: []string{"ls", "--cert", notPEM, "--key", notPEM, "--endpoints", dead}, want: `--cert "` + notPEM + `" with --key`},
		{args: []string{"serve", "--etcd-endpoints", dead, "--etcd-cacert", notPEM}, want: `--etcd-cacert "` + notPEM + `" holds no PEM certificate`},
		{args: []string{"serve", "--etcd-endpoints", dead}, env: []string{"ETCD_AUTH_CA=" + notPEM}, want: `ETCD_AUTH_CA="` + notPEM + `" holds no PEM certificate`},
		{args: []string{"serve", "--etcd-endpoints", dead, "--etcd-cert", notPEM}, want: `--etcd-cert and --etcd-key (or their variables) go together`},
		// The kubernetes driver reads its settings as variables: a flag's
		// bad value was reported under the variable's name, exit 1.
		{args: []string{"ls", "--backend", "kubernetes", "--kube-namespaces", "Bad_NS"}, want: `--kube-namespaces "Bad_NS": namespace "Bad_NS"`},
		{args: []string{"ls", "--backend", "kubernetes"}, env: []string{"BEACON_KUBE_NAMESPACES=Bad_NS"}, want: `BEACON_KUBE_NAMESPACES="Bad_NS"`},
		{args: []string{"ls", "--backend", "kubernetes", "--kubeconfig", "/no/such/kubeconfig"}, want: `--kubeconfig "/no/such/kubeconfig": no such file`},
		{args: []string{"serve", "--backend", "kubernetes"}, env: []string{"KUBECONFIG=/no/such/kubeconfig"}, want: `KUBECONFIG="/no/such/kubeconfig": no such file`},
		// Dynamo's selector: a value Dynamo does not accept either is bad
		// usage listing the accepted ones, and serve honours it as the
		// client commands do.
		{args: []string{"ls"}, env: []string{"DYN_DISCOVERY_BACKEND=nats"}, want: `DYN_DISCOVERY_BACKEND="nats": unknown; use kubernetes, etcd, kv_store (etcd), file or mem (memory)`},
		{args: []string{"serve"}, env: []string{"DYN_DISCOVERY_BACKEND=nats"}, want: `DYN_DISCOVERY_BACKEND="nats"`},
		{args: []string{"ls"}, env: []string{"DYN_DISCOVERY_BACKEND=file"}, want: `DYN_DISCOVERY_BACKEND=file selects Beacon's file store, whose directory format is not Dynamo's`},
		{args: []string{"serve"}, env: []string{"DYN_DISCOVERY_BACKEND=kubernetes", "KUBECONFIG=/no/such/kubeconfig"}, want: `KUBECONFIG="/no/such/kubeconfig"`},
	})
	// A backend flag overrides Dynamo's selector, whatever its value.
	b := startBeacon(t, t.TempDir(), []string{"DYN_DISCOVERY_BACKEND=nats"}, "ls", "--backend", "memory")
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("ls --backend memory with DYN_DISCOVERY_BACKEND=nats: %v\n%s", err, b.errOut())
	}
}

// TestDynamoBackendValues: every DYN_DISCOVERY_BACKEND value NVIDIA Dynamo
// accepts selects Beacon's backend of that kind — kv_store (what Dynamo's
// older releases and docs say for etcd) exited 2, refused, and so did mem
// and file. (kubernetes: TestKubernetesBackend.)
func TestDynamoBackendValues(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	st, err := filestore.Open(context.Background(), filestore.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range [][]string{
		{"DYN_DISCOVERY_BACKEND=kv_store", "ETCD_ENDPOINTS=" + strings.Join(srv.Endpoints(), ",")},
		{"DYN_DISCOVERY_BACKEND=etcd", "ETCD_ENDPOINTS=" + strings.Join(srv.Endpoints(), ",")},
		{"DYN_DISCOVERY_BACKEND=mem"},
		{"DYN_DISCOVERY_BACKEND=file", "BEACON_FILE_DIR=" + dir},
	} {
		b := startBeacon(t, t.TempDir(), tc, "ls", "-o", "json")
		if err := b.wait(t, 30*time.Second); err != nil || !strings.Contains(b.out(), `"instances": []`) {
			t.Errorf("ls with %v: %v\n%s%s", tc, err, b.out(), b.errOut())
		}
	}
}

// TestWriteOutIsOutput: every command with -o/--output also takes
// etcdctl's -w/--write-out, and ETCDCTL_WRITE_OUT=json selects JSON where
// neither is given.
func TestWriteOutIsOutput(t *testing.T) {
	setup(rootCmd)
	n := 0
	walk(rootCmd, func(c *cobra.Command) {
		out := c.Flags().Lookup("output")
		if out == nil {
			return
		}
		n++
		wo := c.Flags().Lookup("write-out")
		if wo == nil || wo.Shorthand != "w" || wo.Value != out.Value {
			t.Errorf("%s has -o but no -w/--write-out bound to it", c.CommandPath())
		}
	})
	if n < 10 {
		t.Fatalf("only %d commands with -o", n)
	}
	env := []string{"BEACON_DISCOVERY_BACKEND=memory"}
	for _, tt := range []struct {
		env  []string
		args []string
		json bool
	}{
		{env, []string{"ls", "-w", "json"}, true},
		{env, []string{"ls", "--write-out", "json"}, true},
		{append(env, "ETCDCTL_WRITE_OUT=json"), []string{"ls"}, true},
		{append(env, "ETCDCTL_WRITE_OUT=json"), []string{"ls", "-o", "table"}, false},
		{append(env, "ETCDCTL_WRITE_OUT=table"), []string{"ls"}, false},
	} {
		b := startBeacon(t, t.TempDir(), tt.env, tt.args...)
		if err := b.wait(t, 30*time.Second); err != nil {
			t.Fatalf("%v: %v\n%s", tt.args, err, b.errOut())
		}
		var v map[string]any
		if isJSON := json.Unmarshal([]byte(b.out()), &v) == nil; isJSON != tt.json {
			t.Errorf("%v with %v: JSON %v, want %v:\n%s", tt.args, tt.env, isJSON, tt.json, b.out())
		}
	}
}

// TestEtcdctlVariables: the client commands honour ETCDCTL_* where
// Beacon's own variables are unset; Beacon's win over etcdctl's and flags
// over both.
func TestEtcdctlVariables(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{User: "root", Password: "s3cret"})
	down := freeURL(t) // nothing listens there
	lsOK := func(env []string, args ...string) {
		t.Helper()
		// etcd checks the password with bcrypt, which can take seconds
		// under -race on a busy machine: more than etcdctl's 2 s default.
		b := startBeacon(t, t.TempDir(), env, append([]string{"ls", "-o", "json", "--dial-timeout", "20s"}, args...)...)
		if err := b.wait(t, 30*time.Second); err != nil {
			t.Fatalf("ls %v with %v: %v\n%s", args, env, err, b.errOut())
		}
	}
	lsFails := func(want string, env []string, args ...string) {
		t.Helper()
		// Long enough for a TLS-less dial and a password check under load;
		// a refused endpoint fails at once anyway.
		b := startBeacon(t, t.TempDir(), env, append([]string{"ls", "--dial-timeout", "20s"}, args...)...)
		if err := b.wait(t, 30*time.Second); err == nil || !strings.Contains(b.errOut(), want) {
			t.Fatalf("ls %v with %v: %v, want an error with %q\n%s", args, env, err, want, b.errOut())
		}
	}
	lsOK([]string{"ETCDCTL_ENDPOINTS=" + srv.Endpoint(), "ETCDCTL_USER=root:s3cret"})
	lsOK([]string{"ETCDCTL_ENDPOINTS=" + srv.Endpoint(), "ETCDCTL_USER=root", "ETCDCTL_PASSWORD=s3cret"})
	lsOK([]string{"ETCDCTL_ENDPOINTS=" + down, "ETCDCTL_USER=nobody:x"}, "--endpoints", srv.Endpoint(), "--user", "root:s3cret")
	lsOK([]string{"ETCDCTL_ENDPOINTS=" + down, "ETCD_ENDPOINTS=" + srv.Endpoint(), "ETCD_AUTH_USERNAME=root", "ETCD_AUTH_PASSWORD=s3cret", "ETCDCTL_USER=nobody:x"})
	lsFails(strings.TrimPrefix(down, "http://"), []string{"ETCDCTL_ENDPOINTS=" + srv.Endpoint(), "ETCD_ENDPOINTS=" + down, "ETCDCTL_USER=root:s3cret"})
	lsFails("authenticate", []string{"ETCDCTL_ENDPOINTS=" + srv.Endpoint(), "ETCDCTL_USER=root:wrong"})
}

// TestClientTLSFlags: --cacert/--cert/--key (and ETCDCTL_CACERT/CERT/KEY,
// and --insecure-skip-tls-verify) reach an etcd that serves TLS and
// requires client certificates.
func TestClientTLSFlags(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{TLS: true})
	c := srv.Certs()
	ep := srv.Endpoint()
	hostport := strings.TrimPrefix(ep, "https://")
	for _, tt := range []struct {
		name string
		env  []string
		args []string
		want string // "" for success, else in the error
	}{
		{"flags", nil, []string{"--endpoints", ep, "--cacert", c.CA, "--cert", c.ClientCert, "--key", c.ClientKey}, ""},
		{"host:port with TLS files", nil, []string{"--endpoints", hostport, "--cacert", c.CA, "--cert", c.ClientCert, "--key", c.ClientKey}, ""},
		{"etcdctl variables", []string{"ETCDCTL_ENDPOINTS=" + ep, "ETCDCTL_CACERT=" + c.CA, "ETCDCTL_CERT=" + c.ClientCert, "ETCDCTL_KEY=" + c.ClientKey}, nil, ""},
		{"beacon variables", []string{"ETCD_ENDPOINTS=" + ep, "ETCD_AUTH_CA=" + c.CA, "ETCD_AUTH_CLIENT_CERT=" + c.ClientCert, "ETCD_AUTH_CLIENT_KEY=" + c.ClientKey}, nil, ""},
		{"skip verify", nil, []string{"--endpoints", ep, "--insecure-skip-tls-verify", "--cert", c.ClientCert, "--key", c.ClientKey}, ""},
		{"no client certificate", nil, []string{"--endpoints", ep, "--cacert", c.CA, "--dial-timeout", "1s"}, "client certificate"},
		{"unknown CA", nil, []string{"--endpoints", ep, "--cert", c.ClientCert, "--key", c.ClientKey, "--dial-timeout", "1s"}, "certificate"},
	} {
		for _, cmd := range [][]string{{"ls", "-o", "json"}, {"token", "ls", "-o", "json"}} {
			b := startBeacon(t, t.TempDir(), tt.env, append(cmd, tt.args...)...)
			err := b.wait(t, 30*time.Second)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("%s: %v: %v\n%s", tt.name, cmd, err, b.errOut())
			case tt.want != "" && (err == nil || !strings.Contains(b.errOut(), tt.want)):
				t.Errorf("%s: %v: %v, want an error with %q\n%s", tt.name, cmd, err, tt.want, b.errOut())
			}
		}
	}
}

// TestRefusedConnectionIsReportedFast: nothing listening is reported as
// refused after the dial timeout (etcdctl's 2 s by default), not after a
// request timeout.
func TestRefusedConnectionIsReportedFast(t *testing.T) {
	start := time.Now()
	b := startBeacon(t, t.TempDir(), nil, "ls", "--endpoints", freeURL(t))
	if err := b.wait(t, 30*time.Second); err == nil || !strings.Contains(b.errOut(), "connection refused") || b.exitCode() != exitFailure {
		t.Fatalf("ls against nothing: %v\n%s", err, b.errOut())
	}
	// The default dial timeout, the diagnosis (1 s at most) and the start
	// of a process: far below the 10 s it took before.
	if took := time.Since(start); took > 6*time.Second {
		t.Fatalf("a refused connection took %v to report", took)
	}
}

// TestRmCommand: rm asks before removing (y removes, anything else keeps,
// no answer stops), --yes does not ask, and deregister is the same
// command.
func TestRmCommand(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ep := srv.Endpoint()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	refs := map[string]string{}
	for _, id := range []string{"00000000000000a1", "00000000000000a2", "00000000000000a3"} {
		o, err := r.RegisterWithTTL(ctx, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", ID: id, Address: "10.0.0.1:80"}, time.Minute)
		in := o.Instance
		if err != nil {
			t.Fatal(err)
		}
		refs[id] = in.Ref().String()
	}
	rm := func(stdin string, args ...string) *child {
		t.Helper()
		b := startBeaconIn(t, t.TempDir(), nil, strings.NewReader(stdin), append(append([]string{}, args...), "--endpoints", ep)...)
		_ = b.wait(t, 30*time.Second)
		return b
	}
	live := func() int {
		t.Helper()
		ins, _, err := r.List(ctx, beacon.Query{Namespace: "prod"})
		if err != nil {
			t.Fatal(err)
		}
		return len(ins)
	}
	if b := rm("n\n", "rm", refs["00000000000000a1"]); b.exitCode() != 0 || !strings.Contains(b.errOut(), "Remove "+refs["00000000000000a1"]+" (10.0.0.1:80, serving, lease") ||
		!strings.Contains(b.out(), "kept") || live() != 3 {
		t.Fatalf("answered n: %d\n%s%s", b.exitCode(), b.out(), b.errOut())
	}
	if b := rm("", "rm", refs["00000000000000a1"]); b.exitCode() != exitFailure || !strings.Contains(b.errOut(), "no answer") || live() != 3 {
		t.Fatalf("no answer: %d\n%s%s", b.exitCode(), b.out(), b.errOut())
	}
	if b := rm("y\n", "rm", refs["00000000000000a1"]); b.exitCode() != 0 || !strings.Contains(b.out(), "removed "+refs["00000000000000a1"]) || live() != 2 {
		t.Fatalf("answered y: %d\n%s%s", b.exitCode(), b.out(), b.errOut())
	}
	if b := rm("", "deregister", "--yes", refs["00000000000000a2"], refs["00000000000000a3"]); b.exitCode() != 0 || live() != 0 {
		t.Fatalf("deregister --yes: %d\n%s%s", b.exitCode(), b.out(), b.errOut())
	}
	if b := rm("", "rm", "--yes", refs["00000000000000a1"]); b.exitCode() != exitFailure || !strings.Contains(b.errOut(), "not registered") {
		t.Fatalf("rm of an instance that is gone: %d\n%s", b.exitCode(), b.errOut())
	}
	checkBadInput(t, []badInput{
		{args: []string{"rm", "prod/api/http"}, want: "want namespace/component/endpoint/id"},
		{args: []string{"rm"}, want: "requires at least 1 arg"},
	})
}

// TestNATSReadersNeedABucket: ls, watch and rm on the nats backend refuse
// a BEACON_NATS_BUCKET that names no bucket (a mistyped name) with bad
// usage naming it, and create no bucket: ls printed "(no instances)", exit
// 0, and left the stream KV_bekon behind.
func TestNATSReadersNeedABucket(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	env := []string{"BEACON_DISCOVERY_BACKEND=nats", "NATS_URL=" + srv.ClientURL(), "BEACON_NATS_BUCKET=bekon"}
	want := `BEACON_NATS_BUCKET="bekon": the NATS server has no stream KV_bekon`
	checkBadInput(t, []badInput{
		{args: []string{"ls"}, env: env, want: want},
		{args: []string{"watch", "prod"}, env: env, want: want},
		{args: []string{"rm", "--yes", "prod/api/http/00000000000000a1"}, env: env, want: want},
	})
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(context.Background(), "KV_bekon"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("a reader created the bucket: %v", err)
	}
}

// TestNATSWatchEndsOnSIGINTWhenServerHangs: beacon watch on the nats
// backend exits on SIGINT while its server takes requests and answers
// none; it ignored SIGINT and SIGTERM, its store's Close waiting for a
// consumer's re-creation that never ended.
func TestNATSWatchEndsOnSIGINTWhenServerHangs(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	natstest.Open(t, natsstore.Config{URL: srv.ClientURL()}) // creates the bucket
	env := []string{"BEACON_DISCOVERY_BACKEND=nats", "NATS_URL=" + srv.ClientURL()}
	watch := startBeacon(t, t.TempDir(), env, "watch", "prod")
	watch.waitLine(t, "synced", 30*time.Second)
	requests := natstest.Hang(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	select {
	case <-requests: // the watch reconnected and asks the hung server
	case <-ctx.Done():
		t.Fatal("beacon watch never reached the hung server")
	}
	_ = watch.cmd.Process.Signal(syscall.SIGINT)
	_ = watch.wait(t, 30*time.Second)
}

// TestFileReadersNeedAStore: ls, watch and rm on the file backend refuse
// a BEACON_FILE_DIR that does not exist or holds no store (a mistyped
// directory) with bad usage, and create nothing; once a store exists there,
// they work.
func TestFileReadersNeedAStore(t *testing.T) {
	base := t.TempDir()
	typo := base + "/stroe"
	empty := base + "/empty"
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []struct{ path, want string }{{typo, "does not exist: check BEACON_FILE_DIR"}, {empty, "holds no store yet"}} {
		env := []string{"BEACON_DISCOVERY_BACKEND=file", "BEACON_FILE_DIR=" + dir.path}
		checkBadInput(t, []badInput{
			{args: []string{"ls"}, env: env, want: dir.want},
			{args: []string{"watch", "prod"}, env: env, want: dir.want},
			{args: []string{"rm", "--yes", "prod/api/http/00000000000000a1"}, env: env, want: dir.want},
		})
	}
	if _, err := os.Stat(typo); !os.IsNotExist(err) {
		t.Errorf("a reader created the mistyped directory %s (stat: %v)", typo, err)
	}
	if entries, err := os.ReadDir(empty); err != nil || len(entries) != 0 {
		t.Errorf("a reader wrote into the empty directory: %v %v", entries, err)
	}

	st, err := filestore.Open(context.Background(), filestore.Config{Dir: typo})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	b := startBeacon(t, t.TempDir(), []string{"BEACON_DISCOVERY_BACKEND=file", "BEACON_FILE_DIR=" + typo}, "ls", "-o", "json")
	if err := b.wait(t, 30*time.Second); err != nil || !strings.Contains(b.out(), `"instances": []`) {
		t.Fatalf("ls of an existing empty store: %v\n%s%s", err, b.out(), b.errOut())
	}
}

// TestTokenLs lists the registry's tokens as a table and as the JSON of
// GET /v1/tokens; token new prints the registry's advertised client URLs.
func TestTokenLs(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ep := srv.Endpoint()
	hostport := strings.TrimPrefix(ep, "http://")
	var toks []string
	for _, size := range []string{"1", "3"} {
		b := startBeacon(t, t.TempDir(), nil, "token", "new", "--size", size, "--endpoints", hostport)
		if err := b.wait(t, 30*time.Second); err != nil {
			t.Fatalf("token new: %v\n%s", err, b.errOut())
		}
		if !strings.Contains(b.out(), "--discovery-endpoints="+ep) {
			t.Errorf("token new does not print the registry's advertised client URL %s:\n%s", ep, b.out())
		}
		for _, w := range strings.Fields(b.out()) {
			if strings.HasPrefix(w, "--discovery-token=") {
				toks = append(toks, strings.TrimPrefix(w, "--discovery-token="))
				break
			}
		}
	}
	b := startBeacon(t, t.TempDir(), nil, "token", "ls", "--endpoints", ep)
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("token ls: %v\n%s", err, b.errOut())
	}
	for _, want := range append([]string{"TOKEN", "SIZE", "REGISTERED", "STATE", "CREATED", "waiting"}, toks...) {
		if !strings.Contains(b.out(), want) {
			t.Errorf("token ls lacks %q:\n%s", want, b.out())
		}
	}
	b = startBeacon(t, t.TempDir(), nil, "token", "ls", "-o", "json", "--endpoints", ep)
	var list bootstrap.ListTokensResponse
	if err := b.wait(t, 30*time.Second); err != nil || json.Unmarshal([]byte(b.out()), &list) != nil || len(list.Tokens) != 2 ||
		list.Tokens[0].Token != toks[0] || list.Tokens[0].Size != 1 || list.Tokens[1].Size != 3 || list.Tokens[0].CreatedAt == nil {
		t.Fatalf("token ls -o json: %v\n%s", err, b.out())
	}

	// Two members of a token of 2 that share a name: full, but the
	// cluster cannot form; ls said plain "full".
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := bootstrap.CreateToken(ctx, cli, "clash", 2); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{"http://10.9.0.1:2380", "http://10.9.0.2:2380"} {
		id, err := bootstrap.MemberID([]string{url}, "clash")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, bootstrap.MemberKey("clash", id), "infra="+url); err != nil {
			t.Fatal(err)
		}
	}
	b = startBeacon(t, t.TempDir(), nil, "token", "ls", "--endpoints", ep)
	if err := b.wait(t, 30*time.Second); err != nil || !strings.Contains(b.out(), `full, cannot form: discovery: found duplicate name: "infra" is registered by`) {
		t.Fatalf("token ls with a name clash: %v\n%s", err, b.out())
	}
}

// TestCompletion completes flag values and, from the registry, names.
func TestCompletion(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	ep := srv.Endpoint()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, c := range []string{"api", "web"} {
		if _, err := r.RegisterWithTTL(ctx, beacon.Instance{Namespace: "prod", Component: c, Endpoint: "http", ID: "00000000000000a1", Address: "10.0.0.1:80"}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := bootstrap.CreateToken(ctx, st.Client(), "tok-completion", 3); err != nil {
		t.Fatal(err)
	}
	complete := func(args ...string) []string {
		t.Helper()
		b := startBeacon(t, t.TempDir(), nil, append([]string{cobra.ShellCompRequestCmd}, args...)...)
		if err := b.wait(t, 30*time.Second); err != nil {
			t.Fatalf("__complete %v: %v\n%s", args, err, b.errOut())
		}
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(b.out()), "\n") {
			if !strings.HasPrefix(l, ":") {
				out = append(out, l)
			}
		}
		return out
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "--backend", ""}, "etcd memory file nats kubernetes"},
		{[]string{"serve", "--backend", ""}, "etcd memory file nats kubernetes"},
		{[]string{"proxy", "--mode", ""}, "readwrite readonly"},
		{[]string{"ls", "-o", ""}, "table json"},
		{[]string{"watch", "-w", ""}, "text json"},
		{[]string{"serve", "--log-format", ""}, "text json"},
		{[]string{"ls", "--endpoints", ep, "p"}, "prod/"},
		{[]string{"ls", "--endpoints", ep, "prod/"}, "prod/api/ prod/web/"},
		{[]string{"watch", "--endpoints", ep, "prod/w"}, "prod/web/"},
		{[]string{"ls", "--endpoints", ep, "prod/api/"}, "prod/api/http"},
		{[]string{"rm", "--endpoints", ep, "prod/api/http/"}, "prod/api/http/00000000000000a1"},
		{[]string{"token", "status", "--endpoints", ep, "tok-"}, "tok-completion"},
	} {
		if got := strings.Join(complete(tt.args...), " "); got != tt.want {
			t.Errorf("complete %v = %q, want %q", tt.args, got, tt.want)
		}
	}
}

// TestVersionFromBuildInfo: the VCS revision, time and modification flag
// of the build are reported.
func TestVersionFromBuildInfo(t *testing.T) {
	v := versionFrom(&debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/beaconplane/beacon", Version: "(devel)"},
		Deps:      []*debug.Module{{Path: "go.etcd.io/etcd/server/v3", Version: "v3.7.3"}},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-11-25T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
		},
	})
	if v.Version != "devel" || v.Revision != "0123456789abcdef0123456789abcdef01234567" || v.Time != "2026-11-25T10:00:00Z" ||
		v.Modified == nil || !*v.Modified || v.Deps["go.etcd.io/etcd/server/v3"] != "v3.7.3" {
		t.Fatalf("versionFrom = %+v", v)
	}
	if text := v.text(); !strings.HasPrefix(text, "beacon devel (0123456789ab, 2026-11-25T10:00:00Z, modified)\n") {
		t.Fatalf("text:\n%s", text)
	}
	b, _ := json.Marshal(v)
	for _, want := range []string{`"vcs_revision":"0123456789abcdef`, `"vcs_time":"2026-11-25T10:00:00Z"`, `"vcs_modified":true`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON %s lacks %s", b, want)
		}
	}
}

// TestLogFormatJSON: --log-format json makes every log line, etcd's too,
// one JSON object.
func TestLogFormatJSON(t *testing.T) {
	client, peer, httpURL := freeURL(t), freeURL(t), freeURL(t)
	b := startBeacon(t, t.TempDir(), nil, "serve", "--log-format", "json", "--log-level", "debug", "--etcd-log-level", "info",
		"--listen-client-urls", client, "--listen-peer-urls", peer, "--http-addr", strings.TrimPrefix(httpURL, "http://"), "--dns-addr", "127.0.0.1:0")
	b.waitLine(t, "beacon serve is ready", 60*time.Second)
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("serve: %v\n%s", err, b.errOut())
	}
	lines, etcd := 0, 0
	for _, l := range strings.Split(strings.TrimSpace(b.errOut()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil {
			t.Fatalf("not a JSON log line: %q", l)
		}
		lines++
		if rec["component"] == "etcd" {
			etcd++
		}
	}
	if lines == 0 || etcd == 0 {
		t.Fatalf("%d JSON lines, %d of etcd", lines, etcd)
	}
	checkQuietLog(t, b.errOut())
}

// TestJSONLogDurations: durations in JSON logs read as in the text logs
// ("10s"), not as nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	oldFormat, oldLevel := logFormat, logLevel
	defer func() { logFormat, logLevel = oldFormat, oldLevel }()
	logFormat, logLevel = "json", "info"
	var buf strings.Builder
	lg, err := newLogger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	lg.Info("session lease granted", "ttl", 10*time.Second, slog.Group("g", slog.Duration("took", 1500*time.Millisecond)))
	var rec struct {
		TTL string `json:"ttl"`
		G   struct {
			Took string `json:"took"`
		} `json:"g"`
	}
	if err := json.Unmarshal([]byte(buf.String()), &rec); err != nil || rec.TTL != "10s" || rec.G.Took != "1.5s" {
		t.Fatalf("JSON log line %s (%v): want \"ttl\":\"10s\" and \"took\":\"1.5s\"", buf.String(), err)
	}
}

// TestNegativeBoundsAreRefused: every bound (an integer flag named
// max-…) of every command given -2 is bad usage naming the flag, and -1
// too unless its help says "-1: no limit": --max-watchers -2 and
// --max-registrations -2 silently meant no limit.
func TestNegativeBoundsAreRefused(t *testing.T) {
	setup(rootCmd)
	n := 0
	walk(rootCmd, func(c *cobra.Command) {
		c.Flags().VisitAll(func(fl *pflag.Flag) {
			if !strings.Contains(fl.Name, "max") || !strings.HasPrefix(fl.Value.Type(), "int") {
				return
			}
			n++
			orig, changed := fl.Value.String(), fl.Changed
			defer func() { _ = fl.Value.Set(orig); fl.Changed = changed }()
			for _, v := range []string{"-2", "-1"} {
				if err := c.Flags().Set(fl.Name, v); err != nil {
					t.Fatalf("%s --%s %s: %v", c.CommandPath(), fl.Name, v, err)
				}
				err := checkZeroFlags(c)
				noLimit := strings.Contains(fl.Usage, "-1: no limit")
				switch {
				case v == "-1" && noLimit && err != nil:
					t.Errorf("%s --%s -1 (its help: no limit): %v", c.CommandPath(), fl.Name, err)
				case (v == "-2" || !noLimit) && (err == nil || !strings.Contains(err.Error(), "--"+fl.Name+" "+v)):
					t.Errorf("%s --%s %s: %v, want it refused naming the flag", c.CommandPath(), fl.Name, v, err)
				}
			}
		})
	})
	if n < 10 {
		t.Fatalf("only %d bounds found", n)
	}
}
