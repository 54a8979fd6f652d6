package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/beaconplane/beacon"
	"github.com/spf13/cobra"
)

func init() { rootCmd.AddCommand(newLsCmd()) }

func newLsCmd() *cobra.Command {
	var (
		conn   *registryConn
		output string
	)
	cmd := &cobra.Command{
		Use:   "ls [namespace[/component[/endpoint]]]",
		Short: "List registered instances",
		Long: `List the instances registered under a namespace, component or endpoint (all of
them without an argument), as a table or, with -o json, as one JSON object with
the store revision of the listing and the instances (the stored value format,
with the checkers' verdict as "health").

HEALTH is the verdict on an instance that declares a health check: unknown
(no verdict yet), passing, failing (left out of routing), or failing (panic)
(most of its service fails: served anyway); "-" for an instance without one.

` + registryConnHelp,
		Example: `  beacon ls
  beacon ls prod/api
  beacon ls prod/api/http -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, q, err := conn.openQuery(cmd, args, output, "table", "json")
			if err != nil {
				return err
			}
			defer r.Close()
			rctx, cancel := conn.requestCtx(cmd.Context())
			defer cancel()
			ins, rev, err := r.List(rctx, q)
			if err != nil {
				return err
			}
			if output == "json" {
				return writeListJSON(cmd.OutOrStdout(), ins, rev)
			}
			return writeListTable(cmd.OutOrStdout(), ins, time.Now())
		},
	}
	conn = addExistingRegistryFlags(cmd, &output, "table", "table or json")
	return cmd
}

// listJSON is the output of `beacon ls -o json`.
type listJSON struct {
	Revision  int64             `json:"revision"`
	Instances []beacon.Instance `json:"instances"`
}

func writeListJSON(w io.Writer, ins []beacon.Instance, rev int64) error {
	if ins == nil {
		ins = []beacon.Instance{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(listJSON{Revision: rev, Instances: ins})
}

func writeListTable(w io.Writer, ins []beacon.Instance, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tADDRESS\tTRANSPORT\tSTATUS\tHEALTH\tAGE\tMETADATA")
	for _, in := range ins {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.Ref(), printable(in.Address), dash(in.Transport), in.Status,
			health(in), ageSince(in.RegisteredAt, now), dash(sortedMeta(in.Metadata)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ins) == 0 {
		_, err := fmt.Fprintln(w, "(no instances)")
		return err
	}
	return nil
}

// printable escapes, for a terminal, what registrants choose and a
// terminal would act on instead of showing: control characters (an escape
// sequence that recolours or clears the screen, a newline that forges an
// output line, a tab that shifts columns) and format characters (bidi
// overrides that reorder the text, zero-width characters). They are shown
// as Go escapes (\x1b, \n, \u202e); -o json output is unaffected.
func printable(s string) string {
	if !strings.ContainsFunc(s, unprintable) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !unprintable(r) {
			b.WriteRune(r)
			continue
		}
		q := strconv.QuoteRune(r) // '\x1b', '\n', '\u202e'
		if !strings.HasPrefix(q, "'\\") {
			q = fmt.Sprintf("'\\u%04x'", r) // a format character Go prints as is
		}
		b.WriteString(q[1 : len(q)-1])
	}
	return b.String()
}

func unprintable(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

// health renders the checkers' verdict on an instance: "-" when it
// declares no check, unknown until a verdict exists, passing, failing, or
// "failing (panic)" when its priority level is in panic (served anyway).
func health(in beacon.Instance) string {
	h := in.Health
	switch {
	case h == nil && in.Check == nil:
		return "-"
	case h == nil:
		return string(beacon.HealthUnknown)
	case h.Panic:
		return printable(string(h.Status)) + " (panic)"
	}
	return printable(string(h.Status))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// age renders a duration like kubectl: 45s, 3m, 2h, 5d.
// ageSince is the age of a registration made at t, "-" when the value has
// no registration time (the Dynamo runtime's values have none).
func ageSince(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return age(now.Sub(t))
}

func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
