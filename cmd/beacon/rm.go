package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/spf13/cobra"
)

func init() { rootCmd.AddCommand(newRmCmd()) }

func newRmCmd() *cobra.Command {
	var (
		conn   *registryConn
		yes    bool
		output string
	)
	cmd := &cobra.Command{
		Use:     "rm namespace/component/endpoint/id...",
		Aliases: []string{"deregister"},
		Short:   "Remove registered instances (asks first unless --yes)",
		Long: `Remove instances from the registry: each argument names one instance,
namespace/component/endpoint/id as beacon ls prints it. Each is shown and
removed only after you answer y (or with --yes); it is removed only if it did
not change since it was shown.

This deletes the registration, not the process behind it: a worker that is
still running keeps its lease and writes its instance again at its next
verification (within 10 x TTL/3), and an HTTP client's next heartbeat gets
404 and it registers again. Use rm for the entries of workers that are gone
and for keys written by hand; stop a live worker to take it out of service.

` + registryConnHelp,
		Example: `  beacon rm prod/api/http/95c1d3b2e0a4f7c6
  beacon deregister prod/api/http/95c1d3b2e0a4f7c6 prod/api/http/3f2a9c0d11e4b5a7 --yes`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "text", "json"); err != nil {
				return err
			}
			refs := make([]beacon.Ref, 0, len(args))
			for _, a := range args {
				ref, err := beacon.ParseRef(a)
				if err != nil {
					return usagef("%q: %w: want namespace/component/endpoint/id, as beacon ls prints it", a, err)
				}
				refs = append(refs, ref)
			}
			in := cmd.InOrStdin()
			ctx := cmd.Context()
			r, err := conn.open(ctx, registry.Config{})
			if err != nil {
				return err
			}
			defer r.Close()
			sr, ok := r.(*backend.StoreRegistry)
			if !ok {
				return usagef("rm deletes registrations from a store (etcd, memory, file, nats); the %s backend's instances belong to their pods: delete the pod or its InstanceSet instead", conn.backendName())
			}
			if err := sr.CheckWritable("rm"); err != nil { // --layout dynamo
				return usage(err)
			}
			return runRm(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), bufio.NewReader(in), conn, sr.Store(), sr.StoreRegistry, refs, yes, output == "json")
		},
	}
	conn = addExistingRegistryFlags(cmd, &output, "text", "text or json (one JSON object per removed instance)")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "remove without asking")
	return cmd
}

// rmLine is one line of `beacon rm -o json`.
type rmLine struct {
	Removed  beacon.Instance `json:"removed"`
	Revision int64           `json:"revision"`
}

func runRm(ctx context.Context, out, prompt io.Writer, in *bufio.Reader, conn *registryConn, st store.Store, r *registry.StoreRegistry, refs []beacon.Ref, yes, asJSON bool) error {
	var errs []error
	for _, ref := range refs {
		rctx, cancel := conn.requestCtx(ctx)
		key := r.Keyspace().Key(ref)
		kv, err := st.Get(rctx, key)
		cancel()
		if errors.Is(err, store.ErrNotFound) {
			errs = append(errs, fmt.Errorf("%s: not registered (beacon ls lists what is)", ref))
			continue
		}
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("%s: %w", ref, err))...)
		}
		inst, derr := beacon.UnmarshalInstance(kv.Value)
		desc := "an invalid value"
		if derr == nil {
			desc = printable(inst.Address) + ", " + string(inst.Status)
		}
		if kv.Lease != store.NoLease {
			desc += fmt.Sprintf(", lease %x", uint64(kv.Lease))
		} else {
			desc += ", no lease"
		}
		if !yes {
			ok, err := askYes(prompt, in, fmt.Sprintf("Remove %s (%s)?", ref, desc))
			if err != nil {
				return errors.Join(append(errs, fmt.Errorf("no answer for %s (%w): it and the rest were kept; pass --yes to remove without asking", ref, err))...)
			}
			if !ok {
				fmt.Fprintf(out, "kept %s\n", ref)
				continue
			}
		}
		rctx, cancel = conn.requestCtx(ctx)
		rev, err := st.Delete(rctx, key, store.IfModRevision(kv.ModRevision))
		cancel()
		switch {
		case errors.Is(err, store.ErrConflict):
			errs = append(errs, fmt.Errorf("%s changed since it was shown: not removed; run beacon rm again", ref))
			continue
		case errors.Is(err, store.ErrNotFound):
			errs = append(errs, fmt.Errorf("%s: no longer registered", ref))
			continue
		case err != nil:
			return errors.Join(append(errs, fmt.Errorf("remove %s: %w", ref, err))...)
		}
		if asJSON {
			_ = json.NewEncoder(out).Encode(rmLine{Removed: inst, Revision: rev})
		} else {
			fmt.Fprintf(out, "removed %s\n", ref)
		}
	}
	return errors.Join(errs...)
}

// askYes prints question with " [y/N] " on prompt (standard error, as rm -i
// does, so that -o json output stays JSON) and reads one line of in: true
// for y or yes (any case). Standard input that ends without an answer is
// an error ("standard input ended"), never a yes.
func askYes(out io.Writer, in *bufio.Reader, question string) (bool, error) {
	fmt.Fprintf(out, "%s [y/N] ", question)
	answer, err := in.ReadString('\n')
	if err != nil && answer == "" {
		fmt.Fprintln(out)
		return false, errors.New("standard input ended")
	}
	a := strings.ToLower(strings.TrimSpace(answer))
	return a == "y" || a == "yes", nil
}
