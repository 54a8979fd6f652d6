package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
)

// bootstrapAuth enables etcd authentication on the embedded cluster the
// first time the server starts with --auth: it creates the root user with
// the configured password and the root role, grants it, and enables auth.
// Every step tolerates having been done already (a restart, or another
// member of a new cluster doing the same), so it is safe to run on each
// start. Once auth is on, nothing is changed: the root password given is
// only used to authenticate.
func (s *Server) bootstrapAuth(ctx context.Context) error {
	if !s.sec.Auth || s.member.etcd.Server.AuthStore().IsAuthEnabled() {
		return nil
	}
	pw, err := s.sec.rootPassword()
	if err != nil {
		return err
	}
	if pw == "" {
		return fmt.Errorf("Config.Security.Auth: etcd authentication is not enabled yet, and enabling it needs the root password: put it in Config.Security.RootPasswordFile or %s", EnvRootPassword)
	}
	cli := v3client.New(s.member.etcd.Server)
	defer cli.Close()
	steps := []struct {
		what string
		do   func() error
		done error // the error that means "already done"
	}{
		{"add user root", func() error { _, err := cli.UserAdd(ctx, "root", pw); return err }, rpctypes.ErrUserAlreadyExist},
		{"add role root", func() error { _, err := cli.RoleAdd(ctx, "root"); return err }, rpctypes.ErrRoleAlreadyExist},
		{"grant role root to user root", func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err }, rpctypes.ErrRoleAlreadyExist},
		{"enable auth", func() error { _, err := cli.AuthEnable(ctx); return err }, nil},
	}
	for _, st := range steps {
		if err := st.do(); err != nil && (st.done == nil || !errors.Is(err, st.done)) {
			if errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrPermissionDenied) {
				// Another member enabled auth meanwhile.
				if s.member.etcd.Server.AuthStore().IsAuthEnabled() {
					break
				}
			}
			return fmt.Errorf("Config.Security.Auth: %s: %w", st.what, err)
		}
	}
	s.log.Info("etcd authentication enabled on the embedded cluster; the root user holds the root role")
	return nil
}

// selfCredentials are the user and password the server acts as on its own
// behalf (readiness, the registry served to DNS and the dashboard, v2
// token expiry): --etcd-user/--etcd-password if given, else root with the
// --auth root password.
func (s *Server) selfCredentials() (string, string, error) {
	if u := s.cfg.Backend.Etcd.Username; u != "" {
		return u, s.cfg.Backend.Etcd.Password, nil
	}
	pw, err := s.sec.rootPassword()
	if err != nil || pw == "" {
		return "", "", err
	}
	return "root", pw, nil
}

// embeddedClient returns the server's own in-process client of the
// embedded etcd. Without etcd authentication it is etcd's v3client; with
// it, it authenticates as selfCredentials and renews its token when etcd
// refuses it.
func (s *Server) embeddedClient() (*clientv3.Client, error) {
	user, pw, err := s.selfCredentials()
	if err != nil {
		return nil, err
	}
	a := &embeddedAuthority{srv: s.member.etcd.Server, log: s.log, setting: s.cfg.namer()}
	return userClient(s.member.etcd.Server, a.passwordSource(user, pw), zapFor(s.log)), nil
}

// probeStore is the readiness read: one key at the root of the registry's
// key space (absent: the answer is "not found"), which a user limited to
// the registry prefix may read.
func (s *Server) probeStore(ctx context.Context) error {
	key := s.registryPrefix()
	_, err := s.data.store.Get(ctx, key)
	switch {
	case err == nil, errors.Is(err, store.ErrNotFound):
		return nil
	case errors.Is(err, store.ErrPermissionDenied):
		return fmt.Errorf("the server's etcd user may not read %s: grant it read (or readwrite) on that prefix: %w", key, err)
	case errors.Is(err, store.ErrUnauthenticated):
		return fmt.Errorf("etcd refused the server's credentials: check %s (or %s): %w", s.cfg.setting("Config.Backend.Etcd.Username", "Config.Backend.Etcd.Password"), s.cfg.setting("Config.Security.RootPasswordFile"), err)
	}
	return err
}

// registryPrefix is the root of the registry's key space.
func (s *Server) registryPrefix() string {
	ks, err := beacon.NewKeyspace(s.cfg.Registry.Root)
	if err != nil {
		return beacon.ServicesDir
	}
	return ks.Prefix(beacon.Query{})
}
