package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
)

// Everything that can be checked before embedded etcd writes to the data
// directory is checked first (Config.Validate, probePorts), and what a
// failed first start wrote is removed (dataDirGuard): a bad flag or a
// port in use leaves no half-made member behind.

// validateInitialCluster checks --initial-cluster as etcd will: it parses,
// names this member, gives it exactly its advertised peer URLs, and no
// peer URL belongs to two members.
func validateInitialCluster(c Config) []error {
	if c.Discovery.joining() {
		return nil // the token's registry gives the initial cluster
	}
	m, err := types.NewURLsMap(c.InitialCluster)
	if err != nil {
		return []error{fmt.Errorf("Config.InitialCluster %q: %w: want name=http://host:2380,name=http://host:2380", c.InitialCluster, err)}
	}
	var errs []error
	owner := map[string]string{}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, u := range m[name] {
			if err := validateURL(u.String(), false); err != nil {
				errs = append(errs, fmt.Errorf("Config.InitialCluster %q: member %s: %q: %w", c.InitialCluster, name, u.String(), err))
			}
			if other, ok := owner[u.String()]; ok && other != name {
				errs = append(errs, fmt.Errorf("Config.InitialCluster %q: peer URL %s is given to both %s and %s", c.InitialCluster, u.String(), other, name))
			}
			owner[u.String()] = name
		}
	}
	mine, ok := m[c.Name]
	if !ok {
		return append(errs, fmt.Errorf("Config.InitialCluster %q does not name this member (Config.Name %q): add %s=%s", c.InitialCluster, c.Name,
			c.Name, strings.Join(c.AdvertisePeerURLs, ",")))
	}
	if !sameURLs(mine.StringSlice(), c.AdvertisePeerURLs) {
		errs = append(errs, fmt.Errorf("Config.InitialCluster gives %s the peer URLs %s but Config.AdvertisePeerURLs (default: Config.ListenPeerURLs) are %s: make them the same",
			c.Name, strings.Join(mine.StringSlice(), ","), strings.Join(c.AdvertisePeerURLs, ",")))
	}
	return errs
}

// sameURLs compares two sets of peer URLs as etcd does: equal as text, or
// naming the same addresses once host names are resolved (bounded: when a
// name does not resolve quickly, the sets are taken as equal and etcd has
// the last word).
func sameURLs(a, b []string) bool {
	norm := func(list []string) []string {
		out := make([]string, 0, len(list))
		for _, s := range list {
			if u, err := url.Parse(s); err == nil {
				u.Path = ""
				out = append(out, u.String())
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	na, nb := norm(a), norm(b)
	if slices.Equal(na, nb) {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resolve := func(list []string) ([]string, bool) {
		var out []string
		for _, s := range list {
			u, err := url.Parse(s)
			if err != nil {
				return nil, false
			}
			ips, err := net.DefaultResolver.LookupHost(ctx, u.Hostname())
			if err != nil {
				return nil, false
			}
			for _, ip := range ips {
				out = append(out, u.Scheme+"://"+net.JoinHostPort(ip, u.Port()))
			}
		}
		slices.Sort(out)
		return slices.Compact(out), true
	}
	ra, okA := resolve(na)
	rb, okB := resolve(nb)
	if !okA || !okB {
		return true
	}
	return slices.Equal(ra, rb)
}

// probePorts checks that every port embedded etcd will listen on can be
// taken now, so that a port in use fails before etcd writes anything.
func probePorts(c Config) error {
	var errs []error
	for _, set := range []struct {
		flag string
		urls []string
	}{{"Config.ListenClientURLs", c.ListenClientURLs}, {"Config.ListenPeerURLs", c.ListenPeerURLs}} {
		for _, raw := range set.urls {
			u, err := url.Parse(raw)
			if err != nil {
				continue // Validate reported it
			}
			ln, err := net.Listen("tcp", u.Host)
			if err != nil {
				if errors.Is(err, syscall.EADDRINUSE) {
					errs = append(errs, fmt.Errorf("%s %s: address already in use (another beacon serve or etcd?): choose another with %s", set.flag, raw, set.flag))
				} else {
					errs = append(errs, fmt.Errorf("%s %s: %w", set.flag, raw, err))
				}
				continue
			}
			_ = ln.Close()
		}
	}
	return errors.Join(errs...)
}

// dataDirGuard remembers what the data directory held before a first
// start, so that a failed first start can remove exactly what it created.
type dataDirGuard struct {
	dir     string
	existed bool            // the directory existed
	before  map[string]bool // its entries then
	first   bool            // it held no member: a first start
}

// guardDataDir looks at dir before embedded etcd starts.
func guardDataDir(dir string) *dataDirGuard {
	g := &dataDirGuard{dir: dir, before: map[string]bool{}}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		g.first = true
	case err != nil:
		return g // cannot tell: never remove anything
	default:
		g.existed = true
		for _, e := range entries {
			g.before[e.Name()] = true
		}
		_, statErr := os.Stat(filepath.Join(dir, "member"))
		g.first = errors.Is(statErr, os.ErrNotExist)
	}
	return g
}

// cleanup removes what a failed first start created: the whole directory
// if it did not exist, else the entries that were not there before. It
// never touches a directory that held a member.
func (g *dataDirGuard) cleanup() error {
	if g == nil || !g.first {
		return nil
	}
	if !g.existed {
		return os.RemoveAll(g.dir)
	}
	entries, err := os.ReadDir(g.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !g.before[e.Name()] {
			errs = append(errs, os.RemoveAll(filepath.Join(g.dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}
