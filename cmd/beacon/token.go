package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/spf13/cobra"
)

func init() { rootCmd.AddCommand(newTokenCmd()) }

const tokenEnvHelp = `The discovery registry is an etcd cluster (usually beacon serve's embedded
etcd); reach it with --endpoints or ETCD_ENDPOINTS (default
http://localhost:2379) and, if needed, --user/--password or
ETCD_AUTH_USERNAME/ETCD_AUTH_PASSWORD and --cacert/--cert/--key or
ETCD_AUTH_CA/ETCD_AUTH_CLIENT_CERT/ETCD_AUTH_CLIENT_KEY. Flags win.`

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, inspect and remove cluster bootstrap tokens (etcd v3 discovery)",
		Long: `A discovery token lets the members of a new etcd cluster, or of Beacon servers,
find each other: create one for N members, start every member with
--discovery-token and --discovery-endpoints, and the first N to register
form the cluster. The protocol is etcd's own (etcd 3.6 and later).

` + tokenEnvHelp,
	}
	cmd.AddCommand(newTokenNewCmd(), newTokenStatusCmd(), newTokenRmCmd())
	return cmd
}

// tokenConn holds the flags that reach the registry.
type tokenConn struct {
	flags   *backendFlags
	timeout time.Duration
	output  string
}

func addTokenConnFlags(cmd *cobra.Command) *tokenConn {
	c := &tokenConn{flags: addBackendFlags(cmd, "")}
	// Tokens always live in etcd, whatever backend the registry uses.
	_ = cmd.Flags().MarkHidden("backend")
	cmd.Flags().DurationVar(&c.timeout, "timeout", 10*time.Second, "bound on connecting and on each request")
	cmd.Flags().StringVarP(&c.output, "output", "o", "table", "table or json")
	return c
}

// open connects to the registry etcd.
func (c *tokenConn) open(ctx context.Context) (*etcdstore.Store, error) {
	if c.output != "table" && c.output != "json" {
		return nil, fmt.Errorf("-o %q: want table or json", c.output)
	}
	cfg := c.flags.config().Etcd
	cfg.DialTimeout, cfg.RequestTimeout = c.timeout, c.timeout
	st, err := etcdstore.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("reach the discovery registry: %w", err)
	}
	return st, nil
}

func (c *tokenConn) requestCtx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, c.timeout)
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

` + tokenEnvHelp,
		Args: cobra.NoArgs,
	}
	conn := addTokenConnFlags(cmd)
	cmd.Flags().IntVar(&size, "size", 3, fmt.Sprintf("number of members of the new cluster (1 to %d; 3, 5 or 7 is usual)", bootstrap.MaxSize))
	cmd.Flags().StringVar(&token, "token", "", "token to create (default: a fresh random UUID)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := bootstrap.ValidateSize(size); err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		if token == "" {
			token = bootstrap.NewToken()
		} else if err := bootstrap.ValidateToken(token); err != nil {
			return fmt.Errorf("--token: %w", err)
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
		eps := st.Client().Endpoints()
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
		fmt.Fprintf(out, "Follow the registrations: beacon token status %s --watch\n", token)
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

` + tokenEnvHelp,
		Args: cobra.ExactArgs(1),
	}
	conn := addTokenConnFlags(cmd)
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "follow the registrations until the token is full")
	cmd.Flags().DurationVar(&wait, "wait", 0, "with --watch, give up after this long (default: until interrupted)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		token := args[0]
		if err := bootstrap.ValidateToken(token); err != nil {
			return err
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
			cfg := bootstrap.Config{Token: token, Client: st.Client(), RequestTimeout: conn.timeout, RetryBackoff: 500 * time.Millisecond, MaxRetryBackoff: 10 * time.Second}
			_, err := bootstrap.GetCluster(wctx, cfg, bootstrap.WithProgress(func(p bootstrap.Progress) {
				if conn.output == "table" {
					fmt.Fprintf(out, "%s  %s\n", time.Now().Format("15:04:05"), p)
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
	switch st.State {
	case bootstrap.StateFull:
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
			if i >= st.Size {
				in = "no (cluster was full)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", i+1, m.Name, m.ID, strings.Join(m.PeerURLs, ","), in)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, s := range st.Skipped {
		fmt.Fprintf(out, "Skipped %s = %q: %s\n", s.Key, s.Value, s.Reason)
	}
	if resp.InitialCluster != "" {
		fmt.Fprintf(out, "\nInitial cluster: %s\n", resp.InitialCluster)
	}
	return icErr
}

func newTokenRmCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rm TOKEN",
		Short: "Remove a token and all its registrations",
		Long: `Remove a token: delete its size key and every registration. Members still
waiting on it fail with "discovery: size key not found".

` + tokenEnvHelp,
		Args: cobra.ExactArgs(1),
	}
	conn := addTokenConnFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := bootstrap.ValidateToken(args[0]); err != nil {
			return err
		}
		st, err := conn.open(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
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
