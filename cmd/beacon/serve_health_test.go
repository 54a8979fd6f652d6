package main

import (
	"strings"
	"testing"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server"
	"github.com/spf13/cobra"
)

// TestHealthFlags: health checks are on by default over every store
// backend, off by default for kubernetes (readiness is the check), where
// asking for them is refused naming the flag, and so for the dynamo layout
// (a read-only view).
func TestHealthFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		backend string
		layout  registry.Layout
		on      bool
		err     string
	}{
		{backend: backend.Etcd, on: true},
		{backend: backend.Memory, on: true},
		{args: []string{"--health-checks=false"}, backend: backend.Etcd},
		{backend: backend.Kubernetes},
		{args: []string{"--health-checks"}, backend: backend.Kubernetes, on: true, err: "--health-checks: the kubernetes backend keeps no store"},
		{backend: backend.Etcd, layout: registry.LayoutDynamo},
		{args: []string{"--health-checks"}, backend: backend.Etcd, layout: registry.LayoutDynamo, on: true, err: "--health-checks: the dynamo layout is a read-only view"},
		{args: []string{"--health-checker-id", "node 1"}, backend: backend.Etcd, on: true, err: `--health-checker-id: checker ID "node 1"`},
	} {
		var cfg server.Config
		cmd := &cobra.Command{}
		addHealthFlags(cmd, &cfg.Health)
		if err := cmd.Flags().Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg.Backend.Name, cfg.Registry.Layout = tc.backend, tc.layout
		healthFlags(cmd, &cfg.Health, tc.backend, tc.layout)
		if cfg.Health.Enabled != tc.on {
			t.Errorf("%v with %s: health checks %v, want %v", tc.args, tc.backend, cfg.Health.Enabled, tc.on)
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
