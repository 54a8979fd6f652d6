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
	serve, boot := newServeCmd(), newXDSBootstrapCmd()
	for field, flag := range configFlags {
		cmd := serve
		if strings.HasPrefix(field, "xdsapi.BootstrapConfig.") {
			cmd = boot
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

// TestLibraryErrorsNameFieldsNotFlags: the errors the server's packages
// return (fmt.Errorf, errors.New) name no flag of ours, and every
// configuration field they name is one a flag sets (so that beacon serve
// names the flag). Flags of etcdctl, which the messages suggest running,
// are not ours. Answers to API clients are not errors beacon serve
// prints: answersToClients lists the one built as an error.
func TestLibraryErrorsNameFieldsNotFlags(t *testing.T) {
	flag := regexp.MustCompile(`(^|[^a-z0-9-])--[a-z][a-z0-9-]*`)
	root := filepath.Join("..", "..")
	var files []string
	for _, dir := range []string{"server", "server/dnsapi", "server/xdsapi", "internal/tlsfiles"} {
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
			call, ok := n.(*ast.CallExpr)
			if !ok || !isErrorConstructor(call) {
				return true
			}
			ast.Inspect(call, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				pos := fset.Position(lit.Pos())
				if m := flag.FindString(s); m != "" && !strings.Contains(s, "etcdctl") && !answersToClients[filepath.Base(path)+":"+s] {
					t.Errorf("%s: a library error names the flag %s: name the Config field instead", pos, strings.TrimLeft(m, " ("))
				}
				for _, loc := range configField.FindAllStringIndex(s, -1) {
					field := s[loc[0]:loc[1]]
					if strings.HasPrefix(s[loc[1]:], ".%") {
						continue // a field path completed by the format's arguments
					}
					if _, ok := configFlags[field]; !ok {
						t.Errorf("%s: %s is named in an error but no flag sets it (add it to configFlags)", pos, field)
					}
				}
				return true
			})
			return false
		})
	}
}

// answersToClients are errors the server builds for its HTTP answers,
// which no command prints (/readyz's reason).
var answersToClients = map[string]bool{
	"authboot.go:etcd refused the server's credentials: check --etcd-user/--etcd-password (or --auth-root-password-file): %w": true,
}

// isErrorConstructor reports fmt.Errorf and errors.New calls (not gRPC's
// status.Errorf: those are answers to clients).
func isErrorConstructor(call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && (pkg.Name == "fmt" && sel.Sel.Name == "Errorf" || pkg.Name == "errors" && sel.Sel.Name == "New")
}
