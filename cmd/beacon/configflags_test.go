package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestConfigFlagsNameRealFlags: every flag the table names exists on the
// command that sets the field.
func TestConfigFlagsNameRealFlags(t *testing.T) {
	serve, boot, prox := newServeCmd(), newXDSBootstrapCmd(), newProxyCmd()
	for field, flag := range configFlags {
		cmd := serve
		switch {
		case strings.HasPrefix(field, "xdsapi.BootstrapConfig."):
			cmd = boot
		case strings.HasPrefix(field, "proxy.Config."):
			cmd = prox
		}
		name := strings.TrimPrefix(flag, "--")
		if name == "discovery-*" {
			name = "discovery-token"
		}
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("%s: %s has no flag %s", field, cmd.Name(), flag)
		}
	}
}

// TestWithFlagNames: the fields an error names become the flags that set
// them, wherever they are in a wrapped or joined error; errors.Is still
// sees the original; a field no flag sets is left as it is.
func TestWithFlagNames(t *testing.T) {
	inUse := fmt.Errorf("Config.HTTPAddr 127.0.0.1:1: address already in use: choose another with Config.HTTPAddr: %w", syscall.EADDRINUSE)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{inUse, "--http-addr 127.0.0.1:1: address already in use: choose another with --http-addr: address already in use"},
		{fmt.Errorf("start: %w", errors.Join(errors.New("Config.Discovery.Fallback=exit"), errors.New("Config.Security.HTTPTLS.CertFile and Config.Security.HTTPTLS.KeyFile: give both"))),
			"start: --discovery-fallback=exit\n--http-cert-file and --http-key-file: give both"},
		{errors.New("dnsapi.Config.TTL 1ms: must be whole seconds; xdsapi.BootstrapConfig.CertFile needs xdsapi.BootstrapConfig.CACertFile"),
			"--dns-ttl 1ms: must be whole seconds; --cert needs --cacert"},
		{errors.New("Config.Security.ClientTLS.CertFile/Config.Security.PeerTLS.CertFile configure the embedded etcd"), "--cert-file/--peer-cert-file configure the embedded etcd"},
		{errors.New("no flag sets Config.Registry.Root; Config.DataDir. ends a sentence"), "no flag sets Config.Registry.Root; --data-dir. ends a sentence"},
	} {
		got := withFlagNames(tc.err)
		if got.Error() != tc.want {
			t.Errorf("%q:\n got %q\nwant %q", tc.err, got, tc.want)
		}
	}
	if !errors.Is(withFlagNames(inUse), syscall.EADDRINUSE) {
		t.Error("the translated error hides the original from errors.Is")
	}
	if withFlagNames(nil) != nil {
		t.Error("nil is not nil")
	}
	plain := errors.New("no field here")
	if fe := new(flagError); errors.As(withFlagNames(plain), &fe) {
		t.Error("an error naming no field is wrapped")
	}
}

// TestLibraryErrorsNameFieldsNotFlags: the text the packages of beacon
// serve and beacon proxy make (errors, answers to clients, warnings, logs,
// metric help) names no flag of ours, and every configuration field their
// errors name, or their answers name through SettingName, is one a flag
// sets (so that the commands name the flag). Flags of etcdctl and nats,
// which the messages suggest running, are not ours.
func TestLibraryErrorsNameFieldsNotFlags(t *testing.T) {
	flag := regexp.MustCompile(`(^|[^a-z0-9-])--[a-z][a-z0-9-]*`)
	root := filepath.Join("..", "..")
	var files []string
	for _, dir := range []string{"server", "server/dnsapi", "server/xdsapi", "server/registryapi", "internal/tlsfiles", "proxy", "registry/kube"} {
		m, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			pos := fset.Position(lit.Pos())
			if m := flag.FindString(s); m != "" && !namesAnotherTool(s) {
				t.Errorf("%s: a library names the flag %s: name the Config field instead (through SettingName where the text is not an error)", pos, strings.TrimLeft(m, " ("))
			}
			for _, loc := range configField.FindAllStringIndex(s, -1) {
				field := s[loc[0]:loc[1]]
				if rest := s[loc[1]:]; strings.HasPrefix(rest, ".%") || rest == "." {
					continue // a field path completed by the format's arguments, or by code
				}
				if _, ok := configFlags[field]; !ok && !noFlag[field] {
					t.Errorf("%s: %s is named but no flag sets it (add it to configFlags)", pos, field)
				}
			}
			return true
		})
	}
}

// namesAnotherTool reports text that suggests running another command,
// whose flags are not the library's settings: etcdctl, nats, etcd itself,
// or another beacon subcommand.
func namesAnotherTool(s string) bool {
	for _, tool := range []string{"etcdctl ", "nats stream", "etcd --", "beacon xds bootstrap", "beacon register", "beacon auth"} {
		if strings.Contains(s, tool) {
			return true
		}
	}
	return false
}

// noFlag are fields libraries name that no flag sets: only Go programs
// set them, so no command's user meets the name.
var noFlag = map[string]bool{
	"proxy.Config.PeerURLs":      true,
	"proxy.Config.UpstreamConns": true,
	"Config.Health.Addr":         true, // from POD_IP on kubernetes (healthFlags), checked there
}
