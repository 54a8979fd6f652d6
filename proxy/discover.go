package proxy

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/miekg/dns"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// member is one etcd member as the peer API (GET <peer>/members) and the
// MemberList API describe it.
type member struct {
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

// maxBody bounds what the proxy reads from a discovery or peer response.
const maxBody = 4 << 20

// permanentError marks a discovery failure that retrying will not fix.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func permanent(err error) error { return permanentError{err} }

// sentinelError is err, matching sentinel too, whose message already says
// what sentinel says: "proxy: " + err's message.
type sentinelError struct{ sentinel, err error }

func (e sentinelError) Error() string   { return "proxy: " + e.err.Error() }
func (e sentinelError) Unwrap() []error { return []error{e.sentinel, e.err} }

func isPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// discoverPeers returns the peer URLs of the cluster from the configured
// source (not for Config.Endpoints, which are client URLs).
func (p *Proxy) discoverPeers(ctx context.Context) ([]string, error) {
	c := p.cfg
	switch {
	case c.DiscoveryToken != "" || c.Discovery != nil:
		return p.discoverV3(ctx)
	case c.DiscoveryURL != "":
		return p.discoverV2(ctx, c.DiscoveryURL)
	case c.DiscoverySRV != "":
		return discoverSRV(ctx, c.DiscoverySRV, c.DiscoverySRVName, c.DNSServer)
	case c.InitialCluster != "":
		return parseInitialCluster(c.InitialCluster)
	default:
		return c.PeerURLs, nil
	}
}

// discoverV3 reads the first size members registered under the token with
// the etcd v3 discovery protocol (bootstrap.GetCluster: like etcd's
// GetCluster, a full cluster is fine), waiting for them within ctx.
func (p *Proxy) discoverV3(ctx context.Context) ([]string, error) {
	var dcfg bootstrap.Config
	if p.cfg.Discovery != nil {
		dcfg = *p.cfg.Discovery
	} else {
		cli, err := clientv3.New(clientv3.Config{
			Endpoints:   p.cfg.DiscoveryEndpoints,
			DialTimeout: max(p.cfg.DialTimeout, 2*time.Second),
			TLS:         p.cfg.ClientTLS,
			Logger:      zap.NewNop(),
			Context:     ctx,
		})
		if err != nil {
			return nil, fmt.Errorf("%w: discovery endpoints %v: %v", ErrDiscovery, p.cfg.DiscoveryEndpoints, err)
		}
		defer cli.Close()
		dcfg = bootstrap.Config{Token: p.cfg.DiscoveryToken, Client: cli}
	}
	if dcfg.Logger == nil {
		dcfg.Logger = p.log
	}
	cl, err := bootstrap.GetCluster(ctx, dcfg)
	switch {
	case errors.Is(err, bootstrap.ErrSizeNotFound):
		// bootstrap's message already starts with "discovery: size key
		// not found": say it once.
		return nil, permanent(sentinelError{ErrSizeNotFound, err})
	case errors.Is(err, bootstrap.ErrBadSizeKey), errors.Is(err, bootstrap.ErrInvalidToken),
		errors.Is(err, bootstrap.ErrInvalidURL), errors.Is(err, bootstrap.ErrDuplicateName):
		return nil, permanent(fmt.Errorf("%w: %w", ErrDiscovery, err))
	case err != nil:
		return nil, fmt.Errorf("%w: token %q: %w", ErrDiscovery, dcfg.Token, err)
	}
	return parseInitialCluster(cl.InitialCluster)
}

// v2Node is a node of the etcd v2 keys API.
type v2Node struct {
	Key           string   `json:"key"`
	Value         string   `json:"value"`
	Dir           bool     `json:"dir"`
	Nodes         []v2Node `json:"nodes"`
	CreatedIndex  uint64   `json:"createdIndex"`
	ModifiedIndex uint64   `json:"modifiedIndex"`
}

type v2Response struct {
	Action    string `json:"action"`
	Node      v2Node `json:"node"`
	ErrorCode int    `json:"errorCode"`
	Message   string `json:"message"`
}

// discoverV2 reads an etcd v2 discovery URL the way etcd's v2 GetCluster
// does: <url>/_config/size, then the token's children by creation index.
func (p *Proxy) discoverV2(ctx context.Context, durl string) ([]string, error) {
	base := strings.TrimRight(durl, "/")
	var sizeResp v2Response
	status, err := p.getJSON(ctx, base+"/_config/size", &sizeResp)
	if err != nil {
		if status == http.StatusNotFound {
			return nil, permanent(fmt.Errorf("%w (discovery URL %s: the token does not exist or has expired; create a new one)", ErrSizeNotFound, durl))
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrDiscovery, durl, err)
	}
	size, err := strconv.ParseUint(sizeResp.Node.Value, 10, 0)
	if err != nil || size == 0 {
		return nil, permanent(fmt.Errorf("%w: %s: size key is bad: %q", ErrDiscovery, durl, sizeResp.Node.Value))
	}
	var list v2Response
	if _, err := p.getJSON(ctx, base, &list); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrDiscovery, durl, err)
	}
	nodes := slices.Clone(list.Node.Nodes)
	nodes = slices.DeleteFunc(nodes, func(n v2Node) bool { return path.Base(n.Key) == "_config" || n.Dir })
	slices.SortStableFunc(nodes, func(a, b v2Node) int { return cmp.Compare(a.CreatedIndex, b.CreatedIndex) })
	if uint64(len(nodes)) > size {
		nodes = nodes[:size]
	}
	var vals []string
	for _, n := range nodes {
		if v := strings.TrimSpace(n.Value); strings.Contains(v, "=") {
			vals = append(vals, v)
		}
	}
	if len(vals) == 0 {
		return nil, fmt.Errorf("%w: %s: no member registered yet (0 of %d)", ErrDiscovery, durl, size)
	}
	return parseInitialCluster(strings.Join(vals, ","))
}

// getJSON GETs u and decodes a JSON body; it returns the HTTP status.
func (p *Proxy) getJSON(ctx context.Context, u string, v any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, max(p.cfg.DialTimeout, 5*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, permanent(fmt.Errorf("%w: %q: %v", ErrBadURL, u, err))
	}
	resp, err := p.httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("GET %s: %s: %.200s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: response is not the expected JSON: %v", u, err)
	}
	return resp.StatusCode, nil
}

// discoverSRV finds peer URLs from _etcd-server-ssl._tcp.<domain> (https)
// and _etcd-server._tcp.<domain> (http) SRV records, like etcd's
// --discovery-srv. With a DNS server given, targets are resolved to
// addresses through the same server.
func discoverSRV(ctx context.Context, domain, name, server string) ([]string, error) {
	suffix := ""
	if name != "" {
		suffix = "-" + name
	}
	var out []string
	var errs []error
	for _, s := range []struct{ service, scheme string }{
		{"etcd-server-ssl" + suffix, "https"},
		{"etcd-server" + suffix, "http"},
	} {
		targets, err := lookupSRV(ctx, s.service, domain, server)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, t := range targets {
			out = append(out, (&url.URL{Scheme: s.scheme, Host: t}).String())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no SRV records _etcd-server-ssl%s._tcp.%s or _etcd-server%s._tcp.%s: %v",
			ErrDiscovery, suffix, domain, suffix, domain, errors.Join(errs...))
	}
	return out, nil
}

// lookupSRV returns host:port targets of _service._tcp.domain.
func lookupSRV(ctx context.Context, service, domain, server string) ([]string, error) {
	if server == "" {
		_, addrs, err := net.DefaultResolver.LookupSRV(ctx, service, "tcp", domain)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, a := range addrs {
			out = append(out, net.JoinHostPort(strings.TrimSuffix(a.Target, "."), strconv.Itoa(int(a.Port))))
		}
		return out, nil
	}
	qname := dns.Fqdn("_" + service + "._tcp." + domain)
	in, err := exchange(ctx, server, qname, dns.TypeSRV)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, rr := range in.Answer {
		srv, ok := rr.(*dns.SRV)
		if !ok {
			continue
		}
		hosts := addressesFrom(in.Extra, srv.Target)
		if len(hosts) == 0 {
			for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
				if r, err := exchange(ctx, server, srv.Target, qt); err == nil {
					hosts = append(hosts, addressesFrom(r.Answer, srv.Target)...)
				}
			}
		}
		if len(hosts) == 0 {
			return nil, fmt.Errorf("SRV target %s has no A or AAAA record at %s", srv.Target, server)
		}
		out = append(out, net.JoinHostPort(hosts[0], strconv.Itoa(int(srv.Port))))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no SRV record %s at %s (rcode %s)", qname, server, dns.RcodeToString[in.Rcode])
	}
	return out, nil
}

func addressesFrom(rrs []dns.RR, name string) []string {
	var out []string
	for _, rr := range rrs {
		if !strings.EqualFold(rr.Header().Name, name) {
			continue
		}
		switch a := rr.(type) {
		case *dns.A:
			out = append(out, a.A.String())
		case *dns.AAAA:
			out = append(out, a.AAAA.String())
		}
	}
	return out
}

func exchange(ctx context.Context, server, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Timeout: 5 * time.Second}
	in, _, err := c.ExchangeContext(ctx, m, server)
	if err != nil {
		return nil, fmt.Errorf("DNS %s %s at %s: %w", dns.TypeToString[qtype], name, server, err)
	}
	if in.Truncated {
		c.Net = "tcp"
		if in, _, err = c.ExchangeContext(ctx, m, server); err != nil {
			return nil, fmt.Errorf("DNS %s %s at %s over TCP: %w", dns.TypeToString[qtype], name, server, err)
		}
	}
	return in, nil
}

// fetchMembers reads the member list from the first peer URL that answers
// GET <peer>/members, like etcd's GetClusterFromRemotePeers.
func (p *Proxy) fetchMembers(ctx context.Context, peers []string) ([]member, error) {
	var errs []error
	for _, peer := range peers {
		var ms []member
		if _, err := p.getJSON(ctx, strings.TrimRight(peer, "/")+"/members", &ms); err != nil {
			errs = append(errs, err)
			continue
		}
		if len(ms) == 0 {
			errs = append(errs, fmt.Errorf("GET %s/members: empty member list", peer))
			continue
		}
		return ms, nil
	}
	return nil, fmt.Errorf("%w: tried peer URLs %v: %w", ErrNoMembers, peers, errors.Join(errs...))
}

// newHTTPClient returns the client for peer and discovery requests.
func newHTTPClient(tlsCfg *tls.Config, dialTimeout time.Duration) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	return &http.Client{
		Transport: tr,
		// Like etcd, do not follow redirects from peers.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// clientURLs returns the client URLs of the voting members.
func clientURLs(ms []member) (clients, peers []string) {
	for _, m := range ms {
		peers = append(peers, m.PeerURLs...)
		if m.IsLearner {
			continue
		}
		clients = append(clients, m.ClientURLs...)
	}
	return clients, peers
}
