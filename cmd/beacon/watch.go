package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/spf13/cobra"
)

func init() { rootCmd.AddCommand(newWatchCmd()) }

func newWatchCmd() *cobra.Command {
	var (
		conn   *registryConn
		output string
		from   int64
	)
	cmd := &cobra.Command{
		Use:   "watch [namespace[/component[/endpoint]]]",
		Short: "Follow registered instances: a snapshot, then every change",
		Long: `Print the instances registered under a namespace, component or endpoint (all of
them without an argument), one line per instance, then a "synced" line, then
one line per change (added, updated, removed) until interrupted; an instance
that declares a health check shows its verdict (health=unknown, passing,
failing with the reason, or failing(panic)), and a change of verdict alone is
an "updated" line. If the store
becomes unreachable it prints a "stale" line and keeps trying; once back it
prints the difference ("resync" lines). With -o json every line is one JSON
object: {"kind","type","revision","instance"}, {"kind":"synced",...} or
{"kind":"stale","error"}.

--from-revision resumes after a revision printed earlier: the changes since
then if this process still holds them, else a fresh snapshot (which replaces
what was printed before). A new beacon watch process starts from the current
state, so it holds no earlier changes: unless nothing at all was written to
the store since that revision, it prints a snapshot.

` + registryConnHelp,
		Example: `  beacon watch prod/api
  beacon watch prod -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from < 0 {
				return usagef("--from-revision %d: must not be negative", from)
			}
			r, q, err := conn.openQuery(cmd, args, output, "text", "json")
			if err != nil {
				return err
			}
			defer r.Close()
			return runWatch(cmd.Context(), cmd.OutOrStdout(), r, q, from, output == "json")
		},
	}
	conn = addExistingRegistryFlags(cmd, &output, "text", "text or json (one JSON object per line)")
	cmd.Flags().Int64Var(&from, "from-revision", 0, "resume after this revision (a revision printed earlier; 0, the default: a snapshot of now)")
	allowZero(cmd, "from-revision", "a snapshot of now")
	return cmd
}

// watchLine is one line of `beacon watch -o json`.
type watchLine struct {
	Kind     string           `json:"kind"` // snapshot, changes, resync, synced, stale
	Type     string           `json:"type,omitempty"`
	Revision int64            `json:"revision,omitempty"`
	Count    *int             `json:"count,omitempty"`
	Instance *beacon.Instance `json:"instance,omitempty"`
	Error    string           `json:"error,omitempty"`
}

func runWatch(ctx context.Context, out io.Writer, r registry.Discoverer, q beacon.Query, from int64, asJSON bool) error {
	var opts []registry.WatchOption
	if from > 0 {
		opts = append(opts, registry.FromRevision(from))
	}
	w, err := r.Watch(ctx, q, opts...)
	if err != nil {
		return err
	}
	defer w.Close()
	enc := json.NewEncoder(out)
	synced := false
	for {
		b, err := w.Next(ctx)
		if err != nil {
			if isInterrupt(ctx, err) {
				return nil
			}
			if errors.Is(err, beacon.ErrInvalid) {
				return usagef("--from-revision %d: %w", from, err) // one the store never gave
			}
			return err
		}
		if b.Kind == registry.Stale {
			if asJSON {
				_ = enc.Encode(watchLine{Kind: "stale", Revision: b.Revision, Error: b.Err.Error()})
			} else {
				fmt.Fprintf(out, "stale: %v (retrying; the last view still holds)\n", b.Err)
			}
			continue
		}
		for _, e := range b.Events {
			in := e.Instance
			if asJSON {
				_ = enc.Encode(watchLine{Kind: b.Kind.String(), Type: e.Type.String(), Revision: e.Revision, Instance: &in})
				continue
			}
			fmt.Fprintf(out, "%-8s %-7s %s %s %s%s rev=%d%s\n", b.Kind, e.Type, in.Ref(), printable(in.Address), in.Status, healthSuffix(in),
				e.Revision, metaSuffix(in.Metadata))
		}
		if !synced || b.Kind == registry.Resync {
			synced = true
			n := len(w.Instances())
			if asJSON {
				_ = enc.Encode(watchLine{Kind: "synced", Revision: b.Revision, Count: &n})
			} else {
				fmt.Fprintf(out, "synced   %d instance(s) at revision %d\n", n, b.Revision)
			}
		}
	}
}

// healthSuffix is the verdict on an instance that declares a check, as
// watch prints it: " health=failing(panic)", with the reason of a failure
// quoted (it is the prober's text).
func healthSuffix(in beacon.Instance) string {
	h := health(in)
	if h == "-" {
		return ""
	}
	s := " health=" + strings.ReplaceAll(h, " ", "")
	if in.Health != nil && in.Health.Reason != "" {
		s += " reason=" + strconv.Quote(in.Health.Reason)
	}
	return s
}

func metaSuffix(md map[string]string) string {
	if len(md) == 0 {
		return ""
	}
	return " " + sortedMeta(md)
}
