package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server"
	"github.com/spf13/cobra"
)

// TestHealthFlags: health checks are on by default over every store
// backend, and over kubernetes in a pod (the pod identity set), off by
// default outside one (one Info log says why), where asking for them is
// taken (the server fails at start saying what is missing); off for the
// dynamo layout (a read-only view), where asking for them is refused
// naming the flag. In a pod, peers reach the checker at POD_IP.
func TestHealthFlags(t *testing.T) {
	inPod := map[string]string{"POD_NAME": "serve-0", "POD_NAMESPACE": "demo", "POD_UID": "u-1", "POD_IP": "10.1.2.3"}
	for _, tc := range []struct {
		args    []string
		backend string
		layout  registry.Layout
		env     map[string]string
		on      bool
		addr    string
		log     string
		err     string
	}{
		{backend: backend.Etcd, on: true},
		{backend: backend.Memory, on: true},
		{args: []string{"--health-checks=false"}, backend: backend.Etcd},
		{backend: backend.Kubernetes, log: "health checks off: on Kubernetes the health checker registers itself"},
		{backend: backend.Kubernetes, env: map[string]string{"POD_NAME": "serve-0"}, log: "missing=\"POD_NAMESPACE, POD_UID\""},
		{backend: backend.Kubernetes, env: inPod, on: true, addr: "10.1.2.3:9379"},
		{args: []string{"--health-checks"}, backend: backend.Kubernetes, on: true},
		{args: []string{"--health-checks=false"}, backend: backend.Kubernetes, env: inPod, addr: "10.1.2.3:9379"},
		{args: []string{"--http-addr", "127.0.0.1:9379"}, backend: backend.Kubernetes, env: inPod, on: true},
		{backend: backend.Etcd, env: inPod, on: true},
		{backend: backend.Etcd, layout: registry.LayoutDynamo},
		{backend: backend.Kubernetes, layout: registry.LayoutDynamo, env: inPod, addr: "10.1.2.3:9379"},
		{args: []string{"--health-checks"}, backend: backend.Etcd, layout: registry.LayoutDynamo, on: true, err: "--health-checks: the dynamo layout is a read-only view"},
		{args: []string{"--health-checker-id", "node 1"}, backend: backend.Etcd, on: true, err: `--health-checker-id: checker ID "node 1"`},
	} {
		var cfg server.Config
		cmd := &cobra.Command{}
		addHealthFlags(cmd, &cfg.Health)
		cmd.Flags().StringVar(&cfg.HTTPAddr, "http-addr", "0.0.0.0:9379", "")
		if err := cmd.Flags().Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg.Backend.Name, cfg.Registry.Layout = tc.backend, tc.layout
		var logs strings.Builder
		healthFlags(cmd, &cfg, tc.backend, func(k string) string { return tc.env[k] }, slog.New(slog.NewTextHandler(&logs, nil)))
		if cfg.Health.Enabled != tc.on || cfg.Health.Addr != tc.addr {
			t.Errorf("%v with %s, %v: health checks %v at %q, want %v at %q", tc.args, tc.backend, tc.env, cfg.Health.Enabled,
				cfg.Health.Addr, tc.on, tc.addr)
		}
		if got := logs.String(); tc.log == "" && got != "" || !strings.Contains(got, tc.log) || strings.Count(got, "\n") > 1 {
			t.Errorf("%v with %s, %v: logged %q, want one line with %q", tc.args, tc.backend, tc.env, got, tc.log)
		}
		err := withFlagNames(cfg.Validate())
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v with %s: %v, want an error with %q", tc.args, tc.backend, err, tc.err)
		case tc.err == "" && err != nil && strings.Contains(err.Error(), "Health"):
			t.Errorf("%v with %s: %v", tc.args, tc.backend, err)
		}
	}
}
