package main

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/registry"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Shell completion: `beacon completion bash|zsh|fish|powershell` prints the
// script (cobra's); the functions here complete the values of flags and
// the names of registered instances and tokens.

// completionTimeout bounds the store round trip of a completion: a shell
// must not hang on an unreachable store.
const completionTimeout = 2 * time.Second

// flagValues are the values of flags that take one of a few words.
var flagValues = map[string][]string{
	"mode":                  {"readwrite", "readonly"},
	"log-level":             {"debug", "info", "warn", "error"},
	"etcd-log-level":        {"debug", "info", "warn", "error"},
	"log-format":            {"text", "json"},
	"discovery-fallback":    {"exit", "proxy"},
	"initial-cluster-state": {"new", "existing"},
}

// outputFormats are the words -o may take; each command's flag usage says
// which of them it accepts ("table or json").
var outputFormats = []string{"text", "table", "json"}

// registerCompletions adds value completion to c's flags and, for the
// registry and token commands, name completion to its arguments.
func registerCompletions(c *cobra.Command) {
	visit := func(fl *pflag.Flag) {
		var values []string
		switch fl.Name {
		case "output", "write-out":
			values = formatsIn(c.Flags().Lookup("output").Usage)
		case "backend":
			values = backend.Names() // with the linked registry drivers
		default:
			values = flagValues[fl.Name]
		}
		if values == nil {
			return
		}
		_ = c.RegisterFlagCompletionFunc(fl.Name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
	}
	c.LocalFlags().VisitAll(visit)
	if c.ValidArgsFunction != nil {
		return
	}
	switch c.CommandPath() {
	case "beacon ls", "beacon watch":
		c.ValidArgsFunction = completeNames(false, 1)
	case "beacon register":
		c.ValidArgsFunction = completeNames(false, 1)
	case "beacon rm":
		c.ValidArgsFunction = completeNames(true, -1)
	case "beacon token status", "beacon token rm":
		c.ValidArgsFunction = completeTokens
	}
}

// formatsIn returns the output formats a flag's usage names.
func formatsIn(usage string) []string {
	head, _, _ := strings.Cut(usage, "(")
	var out []string
	for _, w := range strings.FieldsFunc(head, func(r rune) bool { return r == ' ' || r == ',' || r == '|' }) {
		for _, f := range outputFormats {
			if w == f {
				out = append(out, f)
			}
		}
	}
	return out
}

// completeNames completes namespace/component/endpoint[/id] from the
// registered instances, one level at a time (full refs only when refs is
// set). max is the most arguments the command takes (-1: any).
func completeNames(refs bool, max int) cobra.CompletionFunc {
	return func(c *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if max >= 0 && len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names, err := registeredNames(c, toComplete, refs)
		if err != nil {
			cobra.CompDebugln("beacon: "+err.Error(), true)
			return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
		}
		dir := cobra.ShellCompDirectiveNoFileComp
		if len(names) == 1 && strings.HasSuffix(names[0], "/") {
			dir |= cobra.ShellCompDirectiveNoSpace
		}
		return names, dir
	}
}

// registeredNames lists the names at the level toComplete is at: with
// "pro" the namespaces, with "prod/" the components of prod, and so on;
// levels that go deeper end with "/".
func registeredNames(c *cobra.Command, toComplete string, refs bool) ([]string, error) {
	ctx, cancel := context.WithTimeout(contextOf(c), completionTimeout)
	defer cancel()
	conn := &registryConn{clientFlags: &clientFlags{cmd: c}}
	if fl := c.Flags().Lookup("root"); fl != nil {
		conn.root = fl.Value.String()
	}
	r, err := conn.open(ctx, registry.Config{})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var q beacon.Query
	if i := strings.LastIndex(toComplete, "/"); i > 0 {
		if q, err = beacon.ParseQuery(toComplete[:i]); err != nil {
			return nil, nil
		}
	}
	ins, _, err := r.List(ctx, q)
	if err != nil {
		return nil, err
	}
	depth := strings.Count(toComplete, "/") // 0: namespace, 1: component, 2: endpoint, 3: id
	seen := map[string]bool{}
	var out []string
	for _, in := range ins {
		parts := []string{in.Namespace, in.Component, in.Endpoint, in.ID}
		if depth > 3 {
			continue
		}
		name := strings.Join(parts[:depth+1], "/")
		last := depth == 3 || (!refs && depth == 2)
		if !last {
			name += "/"
		}
		if strings.HasPrefix(name, toComplete) && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// completeTokens completes the tokens of the discovery registry.
func completeTokens(c *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(contextOf(c), completionTimeout)
	defer cancel()
	conn := &clientFlags{cmd: c}
	st, err := conn.openEtcd(ctx)
	if err != nil {
		cobra.CompDebugln("beacon: "+err.Error(), true)
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	defer st.Close()
	list, err := bootstrap.ListTokens(ctx, st.Client())
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	var out []string
	for _, t := range list.Tokens {
		if strings.HasPrefix(t.Token, toComplete) {
			out = append(out, t.Token)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func contextOf(c *cobra.Command) context.Context {
	if ctx := c.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
