// Package tlsfiles builds TLS configurations from PEM files that are read
// again when they change, so that certificates, keys and CA bundles rotate
// without a restart. It is what Beacon's own listeners (the HTTP API of
// `beacon serve`, `beacon proxy`) use; etcd's listeners use etcd's
// transport.TLSInfo, which re-reads the certificate and key at every
// handshake but loads the CA bundle once.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// Files names the PEM files of one TLS endpoint, as etcd's flags do.
type Files struct {
	// CertFile and KeyFile are the certificate (chain) and its key.
	CertFile, KeyFile string
	// TrustedCAFile verifies the peer's certificates: clients'
	// certificates for a server, the server's for a client.
	TrustedCAFile string
	// ClientCertAuth makes a server require a client certificate signed
	// by TrustedCAFile. Without it, a server with TrustedCAFile verifies
	// the certificates clients present but does not require one.
	ClientCertAuth bool
}

// Enabled reports whether any file is set, or client certificates are
// asked for (which needs them: Validate says so).
func (f Files) Enabled() bool {
	return f.CertFile != "" || f.KeyFile != "" || f.TrustedCAFile != "" || f.ClientCertAuth
}

// Validate checks the combination (not the files' contents). name says
// how errors name a field of Files ("CertFile", "KeyFile",
// "TrustedCAFile", "ClientCertAuth"): a library names its configuration
// field, a command the flag that sets it.
func (f Files) Validate(name func(field string) string) error {
	var errs []error
	if (f.CertFile == "") != (f.KeyFile == "") {
		errs = append(errs, fmt.Errorf("%s and %s: give both or neither", name("CertFile"), name("KeyFile")))
	}
	if f.ClientCertAuth && f.TrustedCAFile == "" {
		errs = append(errs, fmt.Errorf("%s needs %s, the CA that signs client certificates", name("ClientCertAuth"), name("TrustedCAFile")))
	}
	if f.TrustedCAFile != "" && f.CertFile == "" {
		errs = append(errs, fmt.Errorf("%s without %s: a listener verifies client certificates only over TLS", name("TrustedCAFile"), name("CertFile")))
	}
	for _, p := range []struct{ field, path string }{{"CertFile", f.CertFile}, {"KeyFile", f.KeyFile}, {"TrustedCAFile", f.TrustedCAFile}} {
		if p.path == "" {
			continue
		}
		if _, err := os.Stat(p.path); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name(p.field), p.path, unwrapPath(err)))
		}
	}
	return errors.Join(errs...)
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// stamp identifies a version of a file.
type stamp struct {
	size int64
	mod  time.Time
}

func stat(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	return stamp{fi.Size(), fi.ModTime()}, nil
}

// Config says how a Reloader checks and reports rotations.
type Config struct {
	// Logger receives the reloads and refusals; nil discards.
	Logger *slog.Logger
	// Listener names the listener in logs and metrics ("http", "proxy").
	Listener string
	// Names are the host names and IP addresses clients reach the
	// listener by (its listen address's host unless unspecified, the names
	// it is advertised under). A rotated certificate that does not cover
	// one the certificate in use covers is refused while the one in use is
	// valid: every client reaching the listener by that name would fail
	// to verify it. Without Names, a rotated certificate that shares no
	// name or address with the one in use is refused the same way.
	Names []string
	// Metrics registers beacon_tls_reloads_total and
	// beacon_tls_files_refused; nil registers none. Collectors already
	// registered on it by another Reloader are shared.
	Metrics prometheus.Registerer
}

// Reloader holds the current TLS material of a Files and re-reads it when
// a file's size or modification time changes (checked at most once per
// second, at a handshake). A file that cannot be read or parsed, such as a
// certificate written before its key or a key that does not match the
// certificate, leaves the previous material in use and is logged; the
// next handshake tries again. So does a certificate outside its validity
// period (expired, or not valid yet) while the one in use is inside its
// own: a not-yet-valid one is taken as soon as it becomes valid; and so
// does a certificate that no longer covers the listener's names (see
// Config.Names), logged at error level. Each outcome is counted
// (beacon_tls_reloads_total{listener,outcome}), and
// beacon_tls_files_refused{listener} is 1 while the files on disk are not
// the ones in use.
type Reloader struct {
	files    Files
	log      *slog.Logger
	listener string
	names    []string
	reloads  *prometheus.CounterVec
	refusing prometheus.Gauge
	base     *tls.Config
	now      func() time.Time

	mu      sync.Mutex
	checked time.Time
	stamps  [3]stamp
	// refused is the version of the files last refused, logged once.
	refused [3]stamp
	cert    *tls.Certificate
	pool    *x509.CertPool
	cur     *tls.Config
}

// minCheck is the least time between two checks of the files.
const minCheck = time.Second

// NewReloader loads the files once and returns a Reloader. An error names
// the file: one that cannot be read or parsed, a key that does not match
// its certificate, and an expired certificate (every peer that checks
// dates refuses it: renew it). A certificate not valid yet, and expired
// certificates in the CA bundle, are logged as warnings.
func NewReloader(f Files, o Config) (*Reloader, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{files: f, log: log, listener: o.Listener, names: o.Names, base: &tls.Config{MinVersion: tls.VersionTLS12}, now: time.Now}
	if err := r.metrics(o.Metrics); err != nil {
		return nil, err
	}
	m, err := r.read()
	if err != nil {
		return nil, err
	}
	if m.cert != nil {
		warn, err := checkLeaf(f.CertFile, m.cert.Leaf, r.now())
		if err != nil {
			return nil, err
		}
		if warn != "" {
			log.Warn("TLS certificate not valid yet", "problem", warn)
		}
	}
	r.warnExpiredCAs(m)
	r.use(m)
	return r, nil
}

// material is one reading of the files.
type material struct {
	stamps [3]stamp
	cert   *tls.Certificate
	pool   *x509.CertPool
	// expiredCAs are the subjects of expired certificates in the bundle.
	expiredCAs []string
}

// CheckCertificate reads a certificate and key pair and refuses what
// NewReloader refuses (a pair that does not load or match, an expired
// certificate); warn is set when the certificate is not valid yet. It is
// for files read by others (etcd's listeners), checked once at start.
func CheckCertificate(certFile, keyFile string, now time.Time) (warn string, err error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return "", fmt.Errorf("load certificate %s and key %s: %w", certFile, keyFile, err)
	}
	leaf := c.Leaf
	if leaf == nil && len(c.Certificate) > 0 {
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return "", fmt.Errorf("certificate %s: %w", certFile, err)
		}
	}
	return checkLeaf(certFile, leaf, now)
}

// checkLeaf refuses an expired certificate and warns of one not valid
// yet.
func checkLeaf(certFile string, leaf *x509.Certificate, now time.Time) (warn string, err error) {
	switch {
	case leaf == nil:
	case now.After(leaf.NotAfter):
		return "", fmt.Errorf("certificate %s expired at %s: renew it (peers refuse an expired certificate)",
			certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Sprintf("certificate %s is not valid until %s: peers refuse it until then (check this host's clock and the CA's)",
			certFile, leaf.NotBefore.UTC().Format(time.RFC3339)), nil
	}
	return "", nil
}

// validAt reports whether the certificate of m (if any) is within its
// validity period at t.
func (m *material) validAt(t time.Time) bool {
	if m == nil || m.cert == nil || m.cert.Leaf == nil {
		return true
	}
	return !t.Before(m.cert.Leaf.NotBefore) && !t.After(m.cert.Leaf.NotAfter)
}

func (r *Reloader) warnExpiredCAs(m *material) {
	if len(m.expiredCAs) > 0 {
		r.log.Warn("the CA bundle holds expired certificates: certificates they signed are refused",
			"ca", r.files.TrustedCAFile, "expired", m.expiredCAs)
	}
}

func (r *Reloader) stampsNow() ([3]stamp, error) {
	var out [3]stamp
	for i, p := range []string{r.files.CertFile, r.files.KeyFile, r.files.TrustedCAFile} {
		if p == "" {
			continue
		}
		s, err := stat(p)
		if err != nil {
			return out, err
		}
		out[i] = s
	}
	return out, nil
}

// read reads every file.
func (r *Reloader) read() (*material, error) {
	st, err := r.stampsNow()
	if err != nil {
		return nil, err
	}
	m := &material{stamps: st}
	if r.files.CertFile != "" {
		c, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load certificate %s and key %s: %w", r.files.CertFile, r.files.KeyFile, err)
		}
		if c.Leaf == nil && len(c.Certificate) > 0 {
			c.Leaf, _ = x509.ParseCertificate(c.Certificate[0])
		}
		m.cert = &c
	}
	if r.files.TrustedCAFile != "" {
		data, err := os.ReadFile(r.files.TrustedCAFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file %s: %w", r.files.TrustedCAFile, err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", r.files.TrustedCAFile)
		}
		now := r.now()
		for rest := data; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if c, err := x509.ParseCertificate(b.Bytes); err == nil && now.After(c.NotAfter) {
				m.expiredCAs = append(m.expiredCAs, c.Subject.String())
			}
		}
	}
	return m, nil
}

// use makes m the current material.
func (r *Reloader) use(m *material) {
	r.stamps, r.cert, r.pool = m.stamps, m.cert, m.pool
	r.cur = nil
}

// refresh re-reads the files if they changed.
func (r *Reloader) refresh() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.checked) < minCheck {
		return
	}
	r.checked = now
	st, err := r.stampsNow()
	if err != nil || st == r.stamps {
		if err != nil {
			r.log.Warn("TLS files unreadable; keeping the loaded certificates", "err", err)
		}
		return
	}
	// Each refused version is logged and counted once, and tried again at
	// each check (a certificate not valid yet is taken once it is).
	once := st != r.refused
	m, err := r.read()
	if err != nil {
		if once {
			r.log.Warn("TLS files changed but cannot be loaded; keeping the previous certificates until they can", "err", err)
		}
		r.refuseLocked(st, once, "unreadable")
		return
	}
	oldValid := (&material{cert: r.cert}).validAt(now)
	if !m.validAt(now) && oldValid {
		if once {
			leaf := m.cert.Leaf
			r.log.Warn("TLS files changed but the new certificate is outside its validity period; keeping the previous certificate while it is valid",
				"cert", r.files.CertFile, "not_before", leaf.NotBefore.UTC().Format(time.RFC3339), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339),
				"previous_not_after", r.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		r.refuseLocked(st, once, "validity")
		return
	}
	if dropped := r.droppedNames(m); len(dropped) > 0 {
		if oldValid {
			if once {
				r.log.Error("TLS files changed but the new certificate does not cover names clients reach this listener by; keeping the previous certificate while it is valid: reissue it with these names (or addresses) among its subject alternative names",
					"listener", r.listener, "cert", r.files.CertFile, "missing", dropped, "new_names", certNames(m.cert.Leaf))
			}
			r.refuseLocked(st, once, "names")
			return
		}
		r.log.Error("TLS files changed; the new certificate does not cover names clients reach this listener by, but the previous one is no longer valid: new connections use it, and clients reaching it by these names fail to verify it",
			"listener", r.listener, "cert", r.files.CertFile, "missing", dropped, "new_names", certNames(m.cert.Leaf))
		r.reloads.WithLabelValues(r.listener, "loaded_names_missing").Inc()
	} else {
		r.reloads.WithLabelValues(r.listener, "loaded").Inc()
	}
	r.use(m)
	r.refusing.Set(0)
	if !m.validAt(now) {
		r.log.Warn("TLS files changed; the new certificate is outside its validity period, but so was the previous one: new connections use it",
			"cert", r.files.CertFile, "not_before", m.cert.Leaf.NotBefore.UTC().Format(time.RFC3339), "not_after", m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	} else {
		r.log.Info("TLS files changed; new connections use them", "cert", r.files.CertFile, "ca", r.files.TrustedCAFile)
	}
	r.warnExpiredCAs(m)
}

// refuseLocked records that the files at st are not used, counting it
// once per version (once).
func (r *Reloader) refuseLocked(st [3]stamp, once bool, why string) {
	r.refused = st
	r.refusing.Set(1)
	if once {
		r.reloads.WithLabelValues(r.listener, "refused_"+why).Inc()
	}
}

// droppedNames lists the names clients reach the listener by (Names) that
// the certificate in use covers and m's does not. Without Names, if m's
// certificate covers none of the names and addresses of the one in use,
// it lists those: a rotation that keeps none of them is a wrong file.
func (r *Reloader) droppedNames(m *material) []string {
	if r.cert == nil || r.cert.Leaf == nil || m.cert == nil || m.cert.Leaf == nil {
		return nil
	}
	old, next := r.cert.Leaf, m.cert.Leaf
	var dropped []string
	for _, n := range r.names {
		if covers(old, n) && !covers(next, n) {
			dropped = append(dropped, n)
		}
	}
	if len(r.names) > 0 {
		return dropped
	}
	names := certNames(old)
	for _, n := range names {
		if strings.HasPrefix(n, "*.") {
			n = "beacon-name-check" + n[1:] // a name the wildcard covers
		}
		if covers(next, n) {
			return nil
		}
	}
	return names
}

// covers reports whether c is valid for the host name or IP address n.
func covers(c *x509.Certificate, n string) bool {
	return c.VerifyHostname(n) == nil
}

// certNames lists c's DNS names and IP addresses.
func certNames(c *x509.Certificate) []string {
	out := slices.Clone(c.DNSNames)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}

// ListenerNames returns the names a listener on addr (host:port) is
// reached by, for Config.Names: its host unless unspecified (0.0.0.0,
// ::, empty), and the others given (advertised names, URLs' hosts), each
// once, without "*".
func ListenerNames(addr string, others ...string) []string {
	var out []string
	add := func(h string) {
		h = strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
		if ip := net.ParseIP(h); h == "" || h == "*" || ip != nil && ip.IsUnspecified() || slices.Contains(out, h) {
			return
		}
		out = append(out, h)
	}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		add(host)
	}
	for _, o := range others {
		add(o)
	}
	return out
}

// metrics registers the reload collectors with reg (nil: none).
func (r *Reloader) metrics(reg prometheus.Registerer) error {
	f := promreg.With(reg)
	r.reloads = f.CounterVec("beacon_tls_reloads_total",
		"Changes of a listener's TLS files: loaded, loaded_names_missing (a certificate that does not cover the listener's names, taken because the previous one expired), or refused_unreadable, refused_validity, refused_names (the previous files stay in use).",
		"listener", "outcome")
	refused := f.GaugeVec("beacon_tls_files_refused",
		"1 while a listener's TLS files on disk are refused and the previous ones stay in use (see beacon_tls_reloads_total and the log).",
		"listener")
	r.refusing = refused.WithLabelValues(r.listener)
	return f.Err()
}

// Certificate returns the current certificate (nil without CertFile).
func (r *Reloader) Certificate() *tls.Certificate {
	r.refresh()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert
}

// Pool returns the current CA pool (nil without TrustedCAFile).
func (r *Reloader) Pool() *x509.CertPool {
	r.refresh()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pool
}

// ServerConfig returns the configuration of a TLS server: each handshake
// gets the current certificate and client CA pool. nextProtos are the
// ALPN protocols (e.g. "h2", "http/1.1").
func (r *Reloader) ServerConfig(nextProtos ...string) *tls.Config {
	outer := r.base.Clone()
	outer.NextProtos = nextProtos
	outer.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		r.refresh()
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.cur == nil {
			c := r.base.Clone()
			c.NextProtos = nextProtos
			if r.cert != nil {
				c.Certificates = []tls.Certificate{*r.cert}
			}
			if r.pool != nil {
				c.ClientCAs = r.pool
				c.ClientAuth = tls.VerifyClientCertIfGiven
				if r.files.ClientCertAuth {
					c.ClientAuth = tls.RequireAndVerifyClientCert
				}
			}
			r.cur = c
		}
		return r.cur, nil
	}
	return outer
}

// ClientConfig returns the configuration of a TLS client: the current
// client certificate (if any) at each handshake, and the server verified
// against the current CA pool (the system roots without TrustedCAFile).
func (r *Reloader) ClientConfig(serverName string) *tls.Config {
	c := r.base.Clone()
	c.ServerName = serverName
	if r.files.CertFile != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert := r.Certificate(); cert != nil {
				return cert, nil
			}
			return &tls.Certificate{}, nil
		}
	}
	if r.files.TrustedCAFile != "" {
		// Verify by hand against the current pool, so that a rotated CA
		// bundle applies to new connections.
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: server presented no certificate")
			}
			opts := x509.VerifyOptions{Roots: r.Pool(), DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return c
}
