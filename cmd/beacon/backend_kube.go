package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/store"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The kubernetes backend: registry/kube registers itself as a registry
// driver when imported (programs that do not import it never link
// client-go).

// kubeEnvHelp explains the kubernetes backend's settings.
const kubeEnvHelp = `With --backend kubernetes (BEACON_DISCOVERY_BACKEND=kubernetes, or Dynamo's
DYN_DISCOVERY_BACKEND=kubernetes) instances live in InstanceSet custom
resources and are visible while their pod is Ready (docs/kubernetes.md). The
cluster is reached as kubectl does (--kubeconfig or KUBECONFIG, ~/.kube/config,
else the in-cluster service account); --kube-namespaces or
BEACON_KUBE_NAMESPACES says which namespaces readers see (default POD_NAMESPACE,
else the kubeconfig's; "*" for all). Registering needs the pod's identity from
the Downward API: POD_NAME, POD_NAMESPACE, POD_UID (and CONTAINER_NAME when
several processes of one pod register).`

// retryableAtStart reports whether register should wait for the store that
// gave err at start: it did not answer, or not yet (store.ErrUnavailable,
// which the kubernetes registry also gives for problems waiting does not
// mend: credentials, RBAC, a missing CRD, a bad configuration).
func retryableAtStart(err error) bool {
	if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrUnauthenticated) {
		return false
	}
	for _, permanent := range []error{kube.ErrForbidden, kube.ErrUnauthorized, kube.ErrUntrusted,
		kube.ErrCRDNotInstalled, kube.ErrCRDMismatch, kube.ErrInvalidConfig} {
		if errors.Is(err, permanent) {
			return false
		}
	}
	return true
}

// addKubeFlags adds the kubernetes backend's flags to cmd; they set b's
// DriverEnv (flags win over the variables).
func addKubeFlags(cmd *cobra.Command, b *backendFlags) {
	f := cmd.Flags()
	f.StringVar(&b.kubeconfig, "kubeconfig", "", "kubeconfig file, kubernetes backend (env KUBECONFIG; default ~/.kube/config or in-cluster)")
	f.StringSliceVar(&b.kubeNamespaces, "kube-namespaces", nil, `Kubernetes namespaces readers see, or "*" for all (env `+kube.EnvNamespaces+`)`)
}

// kubeEnv returns the driver settings the kubernetes flags set.
func (b *backendFlags) kubeEnv() map[string]string {
	env := map[string]string{}
	if b.kubeconfig != "" {
		env[kube.EnvKubeconfig] = b.kubeconfig
	}
	if len(b.kubeNamespaces) > 0 {
		env[kube.EnvNamespaces] = strings.Join(b.kubeNamespaces, ",")
	}
	return env
}

// checkKube checks the kubernetes backend's settings before the driver
// opens, naming the flag or the variable each came from (the driver sees
// them all as variables): the namespaces are DNS labels, or "*" alone; an
// explicit kubeconfig file exists.
func (b *backendFlags) checkKube(f *pflag.FlagSet) error {
	ns := lookup(f, "kube-namespaces", kube.EnvNamespaces)
	if ns.val != "" {
		items := strings.Split(ns.val, ",")
		for _, n := range items {
			n = strings.TrimSpace(n)
			if n == kube.AllNamespaces {
				if len(items) > 1 {
					return usagef("%v: %q means every namespace and cannot be combined with others", ns, kube.AllNamespaces)
				}
				continue
			}
			if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
				return usagef("%v: namespace %q: %s", ns, n, strings.Join(msgs, "; "))
			}
		}
	}
	kc := lookup(f, "kubeconfig", kube.EnvKubeconfig)
	if kc.val != "" && !strings.ContainsRune(kc.val, os.PathListSeparator) {
		if _, err := os.Stat(kc.val); err != nil {
			return usagef("%v: %v", kc, unwrapPathError(err))
		}
	}
	return nil
}

// visibilityRetry is how often beacon register re-checks an instance that
// is registered but not visible.
const visibilityRetry = 5 * time.Second

// checkVisibility reports, for a kubernetes registry, whether watchers see
// the registered instances: a "not visible" line with the reason (the pod is
// not Ready, the Service lacks the label, ...), re-checked until it is
// visible, then a "visible" line. Other registries send nothing.
func checkVisibility(ctx context.Context, r registry.Registry) <-chan registerLine {
	kr, ok := r.(*kube.Registry)
	if !ok {
		return nil
	}
	ch := make(chan registerLine, 1)
	go func() {
		reported := ""
		for {
			cctx, cancel := context.WithTimeout(ctx, visibilityRetry)
			vis, err := kr.Visibility(cctx)
			cancel()
			var line registerLine
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				line = registerLine{Event: "not_visible", Error: "cannot check visibility: " + err.Error()}
			case vis.Visible:
				if reported != "" {
					line = registerLine{Event: "visible"}
				}
			default:
				line = registerLine{Event: "not_visible", Error: "registered, but not visible to watchers: " + vis.Reason}
			}
			if line.Event != "" && line.Error != reported {
				select {
				case ch <- line:
				case <-ctx.Done():
					return
				}
				reported = line.Error
			}
			if err == nil && vis.Visible {
				return
			}
			t := time.NewTimer(visibilityRetry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
	}()
	return ch
}
