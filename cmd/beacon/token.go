package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func init() { rootCmd.AddCommand(newTokenCmd()) }

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list, inspect and remove cluster bootstrap tokens (etcd v3 discovery)",
		Long: `A discovery token lets the members of a new etcd cluster, or of Beacon servers,
find each other: create one for N members, start every member with
--discovery-token and --discovery-endpoints, and the first N to register
form the cluster. The protocol is etcd's own (etcd 3.6 and later).

The tokens live in an etcd cluster (usually beacon serve's embedded etcd),
reached like etcdctl reaches it: see any subcommand's --help.`,
	}
	cmd.AddCommand(newTokenNewCmd(), newTokenStatusCmd(), newTokenRmCmd(), newTokenLsCmd())
	return cmd
}

// tokenConn holds the flags that reach the registry.
type tokenConn struct {
	*clientFlags
	output string
}

func addTokenConnFlags(cmd *cobra.Command) *tokenConn {
	// Tokens always live in etcd, whatever backend the registry uses.
	c := &tokenConn{clientFlags: addClientFlags(cmd, false)}
	cmd.Flags().StringVarP(&c.output, "output", "o", "table", "table or json")
	return c
}

// open connects to the registry etcd.
func (c *tokenConn) open(ctx context.Context) (*etcdstore.Store, error) {
	if err := checkOutput(c.output, "table", "json"); err != nil {
		return nil, err
	}
	return c.openEtcd(ctx)
}

func writeTokenJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTokenNewCmd() *cobra.Command {
	var size int
	var token string
	cmd := &cobra.Command{
		Use:   "new",
		Short: "Create a token for a cluster of --size members and print the member flags",
		Long: `Create a discovery token: write its size key, only if nothing exists under
the token yet (a token bootstraps one cluster only), and print the flags that
make etcd 3.6+ members or beacon serve join through it.

` + connHelp,
		Args: cobra.NoArgs,
	}
	conn := addTokenConnFlags(cmd)
	cmd.Flags().IntVar(&size, "size", 3, fmt.Sprintf("number of members of the new cluster (1 to %d; 3, 5 or 7 is usual)", bootstrap.MaxSize))
	cmd.Flags().StringVar(&token, "token", "", "token to create (default: a fresh random UUID)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := bootstrap.ValidateSize(size); err != nil {
			return usagef("--size: %w", err)
		}
		if token == "" {
			token = bootstrap.NewToken()
		} else if err := bootstrap.ValidateToken(token); err != nil {
			return usagef("--token: %w", err)
		}
		st, err := conn.open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		ctx, cancel := conn.requestCtx(cmd.Context())
		defer cancel()
		rev, err := bootstrap.CreateToken(ctx, st.Client(), token, size)
		if err != nil {
			return err
		}
		eps := advertisedClientURLs(ctx, st.Client())
		resp := bootstrap.CreateTokenResponse{Token: token, Size: size, Endpoints: eps, Flags: bootstrap.MemberFlags(token, eps), Revision: rev}
		out := cmd.OutOrStdout()
		if conn.output == "json" {
			return writeTokenJSON(out, resp)
		}
		fmt.Fprintf(out, "Created discovery token %s for a cluster of %d members (registry: %s).\n\n", token, size, strings.Join(eps, ","))
		fmt.Fprintf(out, "Start each member with:\n  %s\n\n", resp.Flags)
		fmt.Fprintf(out, "for example:\n")
		fmt.Fprintf(out, "  beacon serve --name m1 --listen-peer-urls http://10.0.0.1:2380 --listen-client-urls http://10.0.0.1:2379 %s\n", resp.Flags)
		fmt.Fprintf(out, "  etcd --name m1 --listen-peer-urls http://10.0.0.1:2380 --initial-advertise-peer-urls http://10.0.0.1:2380 \\\n")
		fmt.Fprintf(out, "       --listen-client-urls http://10.0.0.1:2379 --advertise-client-urls http://10.0.0.1:2379 %s\n\n", resp.Flags)
		fmt.Fprintf(out, "Follow the registrations: beacon token status %s --watch --endpoints %s\n", token, strings.Join(eps, ","))
		return nil
	}
	return cmd
}

func newTokenStatusCmd() *cobra.Command {
	var watch bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "status TOKEN",
		Short: "Show a token's size, its members in registration order, and whether it is full",
		Long: `Show a token: its size, every registered member in registration order (the
first SIZE form the cluster; later ones were told the cluster is full), and
once full the --initial-cluster the members use. With --watch, print each
registration as it happens until the token is full (bounded by --wait).

` + connHelp,
		Args: cobra.ExactArgs(1),
	}
	conn := addTokenConnFlags(cmd)
	cmd.Flags().BoolVar(&watch, "watch", false, "follow the registrations until the token is full")
	cmd.Flags().DurationVar(&wait, "wait", 0, "with --watch, give up after this long (0, the default: wait until interrupted)")
	allowZero(cmd, "wait", "until interrupted")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		token := args[0]
		if err := bootstrap.ValidateToken(token); err != nil {
			return usage(err)
		}
		if wait < 0 {
			return usagef("--wait %v: must not be negative", wait)
		}
		st, err := conn.open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		out := cmd.OutOrStdout()
		ctx, cancel := conn.requestCtx(cmd.Context())
		status, err := bootstrap.TokenStatus(ctx, st.Client(), token)
		cancel()
		if err != nil && (!watch || !errors.Is(err, bootstrap.ErrTokenNotFound)) {
			if errors.Is(err, bootstrap.ErrSizeNotFound) || errors.Is(err, bootstrap.ErrBadSizeKey) {
				_ = printTokenStatus(out, conn.output, status)
			}
			return err
		}
		if watch && status.State != bootstrap.StateFull {
			wctx := cmd.Context()
			if wait > 0 {
				var wcancel context.CancelFunc
				wctx, wcancel = context.WithTimeout(wctx, wait)
				defer wcancel()
			}
			cfg := bootstrap.Config{Token: token, Client: st.Client(), RequestTimeout: conn.command, RetryBackoff: 500 * time.Millisecond, MaxRetryBackoff: 10 * time.Second}
			_, err := bootstrap.GetCluster(wctx, cfg, bootstrap.WithProgress(func(p bootstrap.Progress) {
				if conn.output == "table" {
					fmt.Fprintf(out, "%s  %s\n", time.Now().Format("15:04:05"), printable(p.String()))
				}
			}))
			if err != nil {
				return err
			}
			ctx, cancel := conn.requestCtx(cmd.Context())
			status, err = bootstrap.TokenStatus(ctx, st.Client(), token)
			cancel()
			if err != nil {
				return err
			}
			if conn.output == "table" {
				fmt.Fprintln(out)
			}
		}
		return printTokenStatus(out, conn.output, status)
	}
	return cmd
}

func printTokenStatus(out io.Writer, format string, st bootstrap.Status) error {
	resp := bootstrap.TokenStatusResponse{Status: st, Registered: st.Registered()}
	var icErr error
	if st.State == bootstrap.StateFull {
		resp.InitialCluster, icErr = st.InitialCluster()
	}
	if format == "json" {
		if err := writeTokenJSON(out, resp); err != nil {
			return err
		}
		return icErr
	}
	fmt.Fprintf(out, "Token:  %s\nSize:   %d\n", st.Token, st.Size)
	switch {
	case st.State == bootstrap.StateFull && icErr != nil:
		// The size is reached, but the members cannot form a cluster
		// (two share a name or a peer URL): say so, not "can form".
		fmt.Fprintf(out, "State:  full: cannot form: all %d members registered, but their registrations clash (below)", st.Size)
		if n := len(st.Late()); n > 0 {
			fmt.Fprintf(out, " (%d more came too late)", n)
		}
		fmt.Fprintln(out)
	case st.State == bootstrap.StateFull:
		fmt.Fprintf(out, "State:  full: all %d members registered; the cluster can form", st.Size)
		if n := len(st.Late()); n > 0 {
			fmt.Fprintf(out, " (%d more came too late)", n)
		}
		fmt.Fprintln(out)
	default:
		fmt.Fprintf(out, "State:  waiting: %d of %d members registered\n", st.Registered(), st.Size)
	}
	if len(st.Members) > 0 {
		fmt.Fprintln(out)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "#\tNAME\tMEMBER ID\tPEER URLS\tIN CLUSTER")
		for i, m := range st.Members {
			in := "yes"
			switch {
			case i >= st.Size:
				in = "no (cluster was full)"
			case icErr != nil:
				in = "no (cannot form)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", i+1, printable(m.Name), m.ID, printable(strings.Join(m.PeerURLs, ",")), in)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, s := range st.Skipped {
		fmt.Fprintf(out, "Skipped %s = %q: %s\n", s.Key, s.Value, s.Reason)
	}
	if resp.InitialCluster != "" {
		fmt.Fprintf(out, "\nInitial cluster: %s\n", printable(resp.InitialCluster))
	}
	return icErr
}

func newTokenRmCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rm TOKEN",
		Short: "Remove a token and all its registrations (asks first unless --yes)",
		Long: `Remove a token: delete its size key and every registration. Members still
waiting on it fail with "discovery: size key not found". It shows the token's
size and registrations and asks first; --yes removes without asking (the
answer is read from standard input: when that ends without one, nothing is
removed).

` + connHelp,
		Example: `  beacon token rm e773fb07-4ff4-4fcc-afca-a54f83fa0787
  beacon token rm e773fb07-4ff4-4fcc-afca-a54f83fa0787 --yes`,
		Args: cobra.ExactArgs(1),
	}
	conn := addTokenConnFlags(cmd)
	var yes bool
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "remove without asking")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := bootstrap.ValidateToken(args[0]); err != nil {
			return usage(err)
		}
		st, err := conn.open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		if !yes {
			ctx, cancel := conn.requestCtx(cmd.Context())
			status, err := bootstrap.TokenStatus(ctx, st.Client(), args[0])
			cancel()
			var desc string
			switch {
			case errors.Is(err, bootstrap.ErrSizeNotFound) || errors.Is(err, bootstrap.ErrBadSizeKey):
				desc = fmt.Sprintf("%d registrations, %v", len(status.Members), err)
			case err != nil:
				return err
			default:
				desc = fmt.Sprintf("size %d, %d registered, %s", status.Size, status.Registered(), status.State)
			}
			ok, err := askYes(cmd.ErrOrStderr(), bufio.NewReader(cmd.InOrStdin()),
				fmt.Sprintf("Remove token %s (%s)? Members still waiting on it will fail.", args[0], desc))
			if err != nil {
				return fmt.Errorf("no answer (%w): token %s was kept; pass --yes to remove without asking", err, args[0])
			}
			if !ok {
				fmt.Fprintf(cmd.OutOrStdout(), "kept token %s\n", args[0])
				return nil
			}
		}
		ctx, cancel := conn.requestCtx(cmd.Context())
		defer cancel()
		n, err := bootstrap.RemoveToken(ctx, st.Client(), args[0])
		if err != nil {
			return err
		}
		if conn.output == "json" {
			return writeTokenJSON(cmd.OutOrStdout(), bootstrap.RemoveTokenResponse{Token: args[0], Deleted: n})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "Removed token %s (%d keys).\n", args[0], n)
		return nil
	}
	return cmd
}

// advertisedClientURLs returns the client URLs the registry's members
// advertise (what members on other hosts must use), or, when the member
// list cannot be read, the endpoints this command used.
func advertisedClientURLs(ctx context.Context, cli *clientv3.Client) []string {
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return cli.Endpoints()
	}
	var urls []string
	for _, m := range resp.Members {
		if !m.IsLearner {
			urls = append(urls, m.ClientURLs...)
		}
	}
	if len(urls) == 0 {
		return cli.Endpoints()
	}
	return urls
}

func newTokenLsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the registry's tokens: size, registrations, state, creation",
		Long: `List every token of the discovery registry, oldest first: its size, how many
members registered (and how many of the size slots they fill), whether it is
full, and when it was created (revision, and time for tokens made by beacon
token new or POST /v1/tokens). A token whose size key is missing or bad is
listed with the problem, and so is a full token whose members cannot form a
cluster (two share a name or a peer URL). -o json prints the same object as GET /v1/tokens.

` + connHelp,
		Args: cobra.NoArgs,
	}
	conn := addTokenConnFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		st, err := conn.open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		ctx, cancel := conn.requestCtx(cmd.Context())
		defer cancel()
		list, err := bootstrap.ListTokens(ctx, st.Client())
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if conn.output == "json" {
			return writeTokenJSON(out, list)
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOKEN\tSIZE\tREGISTERED\tSTATE\tCREATED")
		for _, t := range list.Tokens {
			state, size := string(t.State), strconv.Itoa(t.Size)
			sizeKnown := t.State == bootstrap.StateWaiting || t.State == bootstrap.StateFull
			switch {
			case !sizeKnown:
				state, size = "invalid: "+t.Problem, "-"
			case t.Problem != "":
				state += ", cannot form: " + t.Problem // two members share a name, ...
			}
			created := fmt.Sprintf("rev %d", t.CreatedRevision)
			if t.CreatedAt != nil {
				created = t.CreatedAt.Local().Format(time.DateTime) + " (" + created + ")"
			}
			reg := strconv.Itoa(t.Members)
			if sizeKnown && t.Members != t.Registered {
				reg = fmt.Sprintf("%d (%d too late)", t.Registered, t.Members-t.Registered)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Token, size, reg, state, created)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(list.Tokens) == 0 {
			fmt.Fprintln(out, "(no tokens)")
		}
		return nil
	}
	return cmd
}
