package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/registry/kube"
	"github.com/beaconplane/beacon/store"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func init() { rootCmd.AddCommand(newDynamoCmd()) }

// `beacon dynamo` groups what concerns an NVIDIA Dynamo deployment's own
// registrations, beside the registry commands (ls, watch: --layout dynamo),
// which serve them as Beacon instances.
func newDynamoCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dynamo",
		Short: "Look into what an NVIDIA Dynamo deployment registered in its etcd or cluster",
		Long: `Look into what the NVIDIA Dynamo runtime registered: in its etcd (v1/instances/...,
v1/mdc/...), or on Kubernetes in its DynamoWorkerMetadata resources. To list and
watch its instances, use beacon ls and beacon watch with --layout dynamo
(docs/dynamo.md).`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newDynamoExplainCmd())
	return cmd
}

func newDynamoExplainCmd() *cobra.Command {
	var (
		conn   *clientFlags
		output string
	)
	cmd := &cobra.Command{
		Use:   "explain NAMESPACE/COMPONENT/ENDPOINT/ID",
		Short: "Say why a Dynamo frontend would or would not see one instance",
		Long: `Explain, for one instance of a Dynamo deployment, why its frontends would or would
not see it, one line per check, each with its verdict (ok, warn, fail) and what to
do. In etcd (--backend etcd, the default):

  key         v1/instances/NAMESPACE/COMPONENT/ENDPOINT/ID is there, once
  value       it is an Endpoint value a frontend can parse
  lease       the worker's lease holding it is alive, and how long it has left
  name        how Beacon serves the name (HTTP API, resolver, xDS, DNS)
  model card  v1/mdc/... names the models whose requests a frontend routes to it

On Kubernetes (--backend kubernetes), what Dynamo's runtime writes there, with
the pod in place of the lease:

  key         which DynamoWorkerMetadata resource holds NAMESPACE/COMPONENT/ENDPOINT/ID
              in spec.data.endpoints (one resource alive among several: the
              others are stale)
  value       as in etcd
  pod         the pod its ownerReference names exists, with that UID
  readiness   the pod is Ready in an EndpointSlice of its namespace labelled
              nvidia.com/dynamo-discovery-backend=kubernetes and
              nvidia.com/dynamo-discovery-enabled=true (its Service's labels)
  name        as in etcd
  model card  spec.data.model_cards of the same resource names the models

ID is the instance ID in hex, as in Dynamo's key (2a) or padded as Beacon shows
it (000000000000002a). It exits 0 when a frontend would see the instance, 1 when
it would not (or the store or cluster could not be read), 2 on bad input. -o json
prints the checks as one JSON object.

` + connHelp + `
  --backend       BEACON_DISCOVERY_BACKEND, else Dynamo's DYN_DISCOVERY_BACKEND:
                  etcd (default; Dynamo's kv_store) or kubernetes

On Kubernetes the cluster is reached as kubectl does (--kubeconfig or KUBECONFIG,
~/.kube/config, else the in-cluster service account), and --kube-namespaces or
BEACON_KUBE_NAMESPACES says which namespaces are read (default POD_NAMESPACE,
else the kubeconfig's; "*" for all). It needs list on dynamoworkermetadatas and
endpointslices (deploy/kubernetes/rbac-dynamo.yaml), and get on pods for the pod
check.`,
		Example: `  beacon dynamo explain dynamo/backend/generate/694d98147d54be25
  beacon dynamo explain dynamo/backend/generate/2a --endpoints 10.0.0.2:2379 -o json
  beacon dynamo explain dynamo/backend/generate/1d4c3b2a190817 --backend kubernetes --kube-namespaces dynamo-system`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExplain(cmd, conn, args[0], output)
		},
	}
	conn = addClientFlags(cmd, true)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func runExplain(cmd *cobra.Command, conn *clientFlags, arg, output string) error {
	if err := checkOutput(output, "text", "json"); err != nil {
		return err
	}
	ref, err := dynamo.ParseInstance(arg)
	if err != nil {
		return usage(err)
	}
	bcfg, err := conn.resolve()
	if err != nil {
		return err
	}
	var x dynamo.Explanation
	switch be := bcfg.BackendName(); be {
	case backend.Etcd:
		x, err = explainEtcd(cmd.Context(), conn, ref)
	case backend.Kubernetes:
		x, err = explainKube(cmd.Context(), conn, bcfg, ref)
	default:
		s, _ := backendSetting(cmd.Flags()) // resolve checked it
		return usagef("%v: the %s backend holds no Dynamo registrations: explain reads a Dynamo deployment's etcd (--backend etcd) "+
			"or Kubernetes cluster (--backend kubernetes)", s, be)
	}
	if err != nil {
		return err
	}
	if output == "json" {
		err = writeExplainJSON(cmd.OutOrStdout(), arg, x)
	} else {
		err = writeExplainText(cmd.OutOrStdout(), arg, x)
	}
	if err == nil && !x.Seen {
		err = errors.New("a Dynamo frontend would not see " + arg + ": see the checks above")
	}
	return err
}

// explainEtcd explains ref from the keys of its component in etcd and
// their leases.
func explainEtcd(ctx context.Context, conn *clientFlags, ref beacon.Ref) (dynamo.Explanation, error) {
	st, err := conn.openEtcd(ctx)
	if err != nil {
		return dynamo.Explanation{}, err
	}
	defer st.Close()
	var kvs []dynamo.KV
	for _, prefix := range dynamo.ComponentPrefixes(ref) {
		listed, err := listBounded(ctx, conn, st, prefix)
		if err != nil {
			return dynamo.Explanation{}, err
		}
		for _, kv := range listed {
			kvs = append(kvs, dynamo.KV{Key: kv.Key, Value: kv.Value, ModRevision: kv.ModRevision, Lease: int64(kv.Lease)})
		}
	}
	return dynamo.Explain(ref, kvs, dynamo.Etcd(func(id int64) dynamo.LeaseState { return leaseState(ctx, conn, st, id) })), nil
}

// explainKube explains ref from the DynamoWorkerMetadata resources of the
// namespaces the kubernetes backend reads, their pods and EndpointSlices
// (kube.Dynamo.Explain).
func explainKube(ctx context.Context, conn *clientFlags, bcfg backend.Config, ref beacon.Ref) (dynamo.Explanation, error) {
	r, err := conn.openRegistry(ctx, bcfg, registry.Config{Layout: registry.LayoutDynamo})
	if err != nil {
		return dynamo.Explanation{}, err
	}
	defer r.Close()
	d, ok := r.(*kube.Dynamo)
	if !ok {
		return dynamo.Explanation{}, fmt.Errorf("the kubernetes backend opened a %T, not Dynamo's registry", r)
	}
	rctx, cancel := conn.requestCtx(ctx)
	defer cancel()
	x, err := d.Explain(rctx, ref)
	if err != nil {
		return x, fmt.Errorf("explain %s: %w", ref, err)
	}
	return x, nil
}

func listBounded(ctx context.Context, conn *clientFlags, st *etcdstore.Store, prefix string) ([]store.KeyValue, error) {
	rctx, cancel := conn.requestCtx(ctx)
	defer cancel()
	kvs, _, err := st.List(rctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	return kvs, nil
}

// leaseState asks etcd how long lease id has left; unknown when it does
// not answer.
func leaseState(ctx context.Context, conn *clientFlags, st *etcdstore.Store, id int64) dynamo.LeaseState {
	rctx, cancel := conn.requestCtx(ctx)
	defer cancel()
	resp, err := st.Client().TimeToLive(rctx, clientv3.LeaseID(id))
	if err != nil {
		return dynamo.LeaseState{}
	}
	if resp.TTL < 0 {
		return dynamo.LeaseState{Known: true}
	}
	return dynamo.LeaseState{Known: true, Alive: true, Left: time.Duration(resp.TTL) * time.Second,
		TTL: time.Duration(resp.GrantedTTL) * time.Second}
}

func writeExplainText(w io.Writer, arg string, x dynamo.Explanation) error {
	fmt.Fprintf(w, "%s (Beacon: %s)\n", arg, x.Instance)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range x.Checks {
		line := printable(c.Found)
		if c.Do != "" {
			line += " — " + c.Do
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Verdict, c.Check, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "verdict: "+x.Verdict())
	return err
}

// explainJSON is the output of `beacon dynamo explain -o json`.
type explainJSON struct {
	Instance string `json:"instance"`
	ID       string `json:"id"`
	Verdict  string `json:"verdict"`
	dynamo.Explanation
}

func writeExplainJSON(w io.Writer, arg string, x dynamo.Explanation) error {
	if x.Models == nil {
		x.Models = []string{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(explainJSON{Instance: arg, ID: x.Instance.ID, Verdict: x.Verdict(), Explanation: x})
}
