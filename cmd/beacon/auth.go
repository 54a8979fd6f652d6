package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/beaconplane/beacon"
	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func init() { rootCmd.AddCommand(newAuthCmd()) }

func newAuthCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Create etcd roles for Beacon's namespaces and bootstrap APIs",
		Long: `Beacon's one authority for who may write where is etcd's users and roles: the
HTTP API of beacon serve acts as each request's etcd user, so a role's key
prefixes are its namespaces. These helpers grant the prefixes a role needs;
create users and assign roles with etcdctl (user add, user grant-role).

They talk to etcd as a user allowed to change roles (root). On a cluster
without authentication they grant all the same (to prepare roles before
enabling it) and print a warning: nothing checks roles until it is on.

` + connHelp,
		Example: `  beacon auth grant-namespace team-a-writer team-a --user root
  beacon auth grant-namespace team-a-reader team-a --read-only --user root
  beacon auth grant-bootstrap cluster-admins --user root
  etcdctl user add alice && etcdctl user grant-role alice team-a-writer`,
	}
	cmd.AddCommand(newAuthGrantNamespaceCmd(), newAuthGrantBootstrapCmd())
	return cmd
}

// authConn reaches etcd for the auth commands, with the client commands'
// connection flags (etcdctl's names).
type authConn struct {
	*clientFlags
	root string
}

func addAuthConnFlags(cmd *cobra.Command) *authConn {
	c := &authConn{clientFlags: addClientFlags(cmd, false)}
	cmd.Flags().StringVar(&c.root, "root", "", `keyspace root of the registry (as beacon serve's registry root), e.g. "/beacon"`)
	return c
}

func (c *authConn) open(ctx context.Context) (*etcdstore.Store, beacon.Keyspace, error) {
	ks, err := beacon.NewKeyspace(c.root)
	if err != nil {
		return nil, ks, usagef("--root: %w", err)
	}
	st, err := c.openEtcd(ctx)
	if err != nil {
		return nil, ks, err
	}
	return st, ks, nil
}

// checkRole refuses a role name etcd would take but nobody could type or
// read back: empty, not UTF-8, or with spaces or control characters.
func checkRole(role string) error {
	if role == "" || !utf8.ValidString(role) || strings.ContainsFunc(role, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) {
		return usagef("ROLE %q: want a name of printable characters without spaces, e.g. team-a-writer", role)
	}
	return nil
}

// authOffWarning is printed after granting on an etcd without
// authentication: roles are kept, but nothing checks them until it is on.
const authOffWarning = "warning: etcd authentication is not enabled on this cluster: every client may still read and " +
	"write everything, and the role takes effect only once it is (beacon serve --auth, or etcdctl auth enable)"

// warnIfAuthOff prints authOffWarning to w when etcd says authentication
// is off (granting was allowed, so the user may prepare roles before
// enabling it; but a grant that protects nothing must not look like one
// that does).
func warnIfAuthOff(ctx context.Context, cli *clientv3.Client, w io.Writer) {
	st, err := cli.AuthStatus(ctx)
	if err == nil && !st.Enabled {
		fmt.Fprintln(w, authOffWarning)
	}
}

// grantPrefixes creates role if needed and grants it perm on each prefix.
func grantPrefixes(ctx context.Context, cli *clientv3.Client, role string, grants []prefixGrant) error {
	if _, err := cli.RoleAdd(ctx, role); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("add role %q: %w%s", role, err, authHint(err))
	}
	for _, g := range grants {
		if _, err := cli.RoleGrantPermission(ctx, role, g.prefix, clientv3.GetPrefixRangeEnd(g.prefix), g.perm); err != nil {
			return fmt.Errorf("grant %s on %s to role %q: %w%s", permName(g.perm), g.prefix, role, err, authHint(err))
		}
	}
	return nil
}

type prefixGrant struct {
	prefix string
	perm   clientv3.PermissionType
	why    string
}

func permName(p clientv3.PermissionType) string {
	switch p {
	case clientv3.PermissionType(clientv3.PermRead):
		return "read"
	case clientv3.PermissionType(clientv3.PermWrite):
		return "write"
	}
	return "readwrite"
}

func authHint(err error) string {
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return " (only a root user may change roles: give --user root)"
	case errors.Is(err, rpctypes.ErrUserEmpty):
		return " (etcd has authentication enabled: give --user and --password)"
	}
	return ""
}

func newAuthGrantNamespaceCmd() *cobra.Command {
	var readOnly bool
	var conn *authConn
	cmd := &cobra.Command{
		Use:   "grant-namespace ROLE NAMESPACE",
		Short: "Let a role register in (or only read) one namespace",
		Long: `Create ROLE if it does not exist and grant it NAMESPACE of the registry:

  register (default)  readwrite on <root>/services/NAMESPACE/ (instances) and
                      on <root>/beacon-owners/NAMESPACE/ (the ownership records
                      of registrations made over HTTP)
  --read-only         read on <root>/services/NAMESPACE/ (list, get, watch)

A user with the role can then register, heartbeat, update and deregister in
that namespace through beacon serve's HTTP API or beacon register, and nowhere
else.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			role, ns := args[0], args[1]
			if err := checkRole(role); err != nil {
				return err
			}
			if err := beacon.ValidateLabel("namespace", ns); err != nil {
				return usage(err)
			}
			ctx := cmd.Context()
			st, ks, err := conn.open(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			instances := ks.Prefix(beacon.Query{Namespace: ns})
			grants := []prefixGrant{{instances, clientv3.PermissionType(clientv3.PermRead), "list, get and watch"}}
			if !readOnly {
				grants = []prefixGrant{
					{instances, clientv3.PermissionType(clientv3.PermReadWrite), "instances"},
					{ks.OwnersPrefix(ns), clientv3.PermissionType(clientv3.PermReadWrite), "ownership records of HTTP registrations"},
				}
			}
			rctx, cancel := conn.requestCtx(ctx)
			defer cancel()
			if err := grantPrefixes(rctx, st.Client(), role, grants); err != nil {
				return err
			}
			for _, g := range grants {
				fmt.Fprintf(cmd.OutOrStdout(), "role %s: %s on %s (%s)\n", role, permName(g.perm), g.prefix, g.why)
			}
			warnIfAuthOff(rctx, st.Client(), cmd.ErrOrStderr())
			return nil
		},
	}
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "grant read only (list, get, watch)")
	conn = addAuthConnFlags(cmd)
	return cmd
}

func newAuthGrantBootstrapCmd() *cobra.Command {
	var readOnly bool
	var conn *authConn
	cmd := &cobra.Command{
		Use:   "grant-bootstrap ROLE",
		Short: "Let a role create and remove cluster bootstrap tokens",
		Long: `Create ROLE if it does not exist and grant it the key prefixes of the bootstrap
APIs: /_etcd/registry/ (v3 discovery tokens, /v1/tokens and beacon token) and
` + v2.DefaultPrefix + ` (v2 discovery, /v2/discovery). --read-only grants
read (token status) only.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkRole(args[0]); err != nil {
				return err
			}
			perm := clientv3.PermissionType(clientv3.PermReadWrite)
			if readOnly {
				perm = clientv3.PermissionType(clientv3.PermRead)
			}
			ctx := cmd.Context()
			st, _, err := conn.open(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			grants := []prefixGrant{{"/_etcd/registry/", perm, "v3 discovery tokens"}, {v2.DefaultPrefix, perm, "v2 discovery tokens"}}
			rctx, cancel := conn.requestCtx(ctx)
			defer cancel()
			if err := grantPrefixes(rctx, st.Client(), args[0], grants); err != nil {
				return err
			}
			for _, g := range grants {
				fmt.Fprintf(cmd.OutOrStdout(), "role %s: %s on %s (%s)\n", args[0], permName(g.perm), g.prefix, g.why)
			}
			warnIfAuthOff(rctx, st.Client(), cmd.ErrOrStderr())
			return nil
		},
	}
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "grant read only (token status)")
	conn = addAuthConnFlags(cmd)
	return cmd
}
