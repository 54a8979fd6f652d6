package main

import (
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server"
	"github.com/spf13/cobra"
)

// addHealthFlags registers the health checker's flags on `beacon serve`
// (docs/health.md).
func addHealthFlags(cmd *cobra.Command, h *server.HealthConfig) {
	f := cmd.Flags()
	f.BoolVar(&h.Enabled, "health-checks", true, "run a health checker: probe the instances that declare a check (beacon register --check), shared with the other servers' checkers, and write their verdicts (default off with --backend kubernetes, where readiness is the check, and with --layout dynamo, a read-only view)")
	f.StringVar(&h.CheckerID, "health-checker-id", "", "name of this server's health checker, unique in the cluster (default: --name with embedded etcd, else the host name)")
}

// healthFlags turns health checks off for the kubernetes backend and the
// dynamo layout (a read-only view) unless --health-checks asks for them
// (which the server then refuses, saying why).
func healthFlags(cmd *cobra.Command, h *server.HealthConfig, backendName string, layout registry.Layout) {
	if (backendName == backend.Kubernetes || layout == registry.LayoutDynamo) && !cmd.Flags().Changed("health-checks") {
		h.Enabled = false
	}
}
