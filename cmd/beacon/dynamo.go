package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/beaconplane/beacon/dynamo"
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
		Short: "Look into what an NVIDIA Dynamo deployment registered in its etcd",
		Long: `Look into what the NVIDIA Dynamo runtime registered in its etcd (v1/instances/...,
v1/mdc/...). To list and watch its instances, use beacon ls and beacon watch with
--layout dynamo (docs/dynamo.md).`,
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
do:

  key         v1/instances/NAMESPACE/COMPONENT/ENDPOINT/ID is there, once
  value       it is an Endpoint value a frontend can parse
  lease       the worker's lease holding it is alive, and how long it has left
  name        how Beacon serves the name (HTTP API, resolver, xDS, DNS)
  model card  v1/mdc/... names the models whose requests a frontend routes to it

ID is the instance ID in hex, as in Dynamo's key (2a) or padded as Beacon shows
it (000000000000002a). It exits 0 when a frontend would see the instance, 1 when
it would not (or etcd could not be read), 2 on bad input. -o json prints the
checks as one JSON object.

` + connHelp,
		Example: `  beacon dynamo explain dynamo/backend/generate/694d98147d54be25
  beacon dynamo explain dynamo/backend/generate/2a --endpoints 10.0.0.2:2379 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExplain(cmd, conn, args[0], output)
		},
	}
	conn = addClientFlags(cmd, false) // Dynamo's KV store is etcd
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
	ctx := cmd.Context()
	st, err := conn.openEtcd(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	var kvs []dynamo.KV
	for _, prefix := range dynamo.ComponentPrefixes(ref) {
		listed, err := listBounded(ctx, conn, st, prefix)
		if err != nil {
			return err
		}
		for _, kv := range listed {
			kvs = append(kvs, dynamo.KV{Key: kv.Key, Value: kv.Value, ModRevision: kv.ModRevision, Lease: int64(kv.Lease)})
		}
	}
	x := dynamo.Explain(ref, kvs, dynamo.Etcd(func(id int64) dynamo.LeaseState { return leaseState(ctx, conn, st, id) }))
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
