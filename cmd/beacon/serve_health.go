package main

import (
	"log/slog"
	"net"
	"strings"

	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/server"
	"github.com/spf13/cobra"
)

// envPodIP is the pod's IP from the Downward API (fieldRef status.podIP):
// where the other pods' checkers reach this one's.
const envPodIP = "POD_IP"

// healthOffOutsidePod is the Info log of a kubernetes serve without the
// pod identity, which runs no health checker.
const healthOffOutsidePod = "health checks off: on Kubernetes the health checker registers itself and keeps its " +
	"verdicts in its pod's InstanceSet, which needs the pod identity from the Downward API; run beacon serve in a pod " +
	"with " + kube.EnvPodName + ", " + kube.EnvPodNamespace + " and " + kube.EnvPodUID + " set " +
	"(deploy/kubernetes/checker.yaml) to check the instances that declare a check"

// addHealthFlags registers the health checker's flags on `beacon serve`
// (docs/health.md).
func addHealthFlags(cmd *cobra.Command, h *server.HealthConfig) {
	f := cmd.Flags()
	f.BoolVar(&h.Enabled, "health-checks", true, "run a health checker: probe the instances that declare a check (beacon register --check), shared with the other servers' checkers, and write their verdicts (default off with --layout dynamo, a read-only view, and with --backend kubernetes outside a pod: there the checker needs "+kube.EnvPodName+", "+kube.EnvPodNamespace+" and "+kube.EnvPodUID+")")
	f.StringVar(&h.CheckerID, "health-checker-id", "", "name of this server's health checker, unique in the cluster (default: --name with embedded etcd, else the host name)")
}

// healthFlags decides whether the health checker runs when --health-checks
// is not given: over every store backend; over kubernetes when serve runs
// in a pod (the Downward API's POD_NAME, POD_NAMESPACE and POD_UID are set:
// the checker registers itself, and keeps its verdicts in its pod's
// InstanceSet), else not, with one Info log saying why; never for the
// dynamo layout (a read-only view, where the server refuses
// --health-checks). On kubernetes, with POD_IP set and --http-addr on an
// unspecified host (0.0.0.0), the checker's peers reach it at POD_IP (a
// pod's host name resolves only inside it).
func healthFlags(cmd *cobra.Command, cfg *server.Config, backendName string, getenv func(string) string, log *slog.Logger) {
	h := &cfg.Health
	if backendName == backend.Kubernetes {
		h.Addr = podAddr(cfg.HTTPAddr, getenv)
	}
	if cmd.Flags().Changed("health-checks") {
		return
	}
	switch {
	case cfg.Registry.Layout == registry.LayoutDynamo:
		h.Enabled = false
	case backendName == backend.Kubernetes:
		if missing := missingPodIdentity(getenv); missing != "" {
			h.Enabled = false
			log.Info(healthOffOutsidePod, "missing", missing)
		}
	}
}

// missingPodIdentity names the pod identity variables that are not set,
// "" when none is missing.
func missingPodIdentity(getenv func(string) string) string {
	var missing []string
	for _, v := range []string{kube.EnvPodName, kube.EnvPodNamespace, kube.EnvPodUID} {
		if strings.TrimSpace(getenv(v)) == "" {
			missing = append(missing, v)
		}
	}
	return strings.Join(missing, ", ")
}

// podAddr is POD_IP with the port of httpAddr when httpAddr's host is
// unspecified, else "" (the server's default).
func podAddr(httpAddr string, getenv func(string) string) string {
	host, port, err := net.SplitHostPort(httpAddr)
	ip := net.ParseIP(strings.TrimSpace(getenv(envPodIP)))
	if err != nil || ip == nil || port == "0" || (host != "" && !net.ParseIP(host).IsUnspecified()) {
		return ""
	}
	return net.JoinHostPort(ip.String(), port)
}
