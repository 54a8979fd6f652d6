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
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
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

// Enabled reports whether any file is set.
func (f Files) Enabled() bool { return f.CertFile != "" || f.KeyFile != "" || f.TrustedCAFile != "" }

// Validate checks the combination (not the files' contents); flag is the
// flag prefix to name in errors ("", "peer-", "http-").
func (f Files) Validate(flag string) error {
	var errs []error
	if (f.CertFile == "") != (f.KeyFile == "") {
		errs = append(errs, fmt.Errorf("--%scert-file and --%skey-file: give both or neither", flag, flag))
	}
	if f.ClientCertAuth && f.TrustedCAFile == "" {
		errs = append(errs, fmt.Errorf("--%sclient-cert-auth needs --%strusted-ca-file, the CA that signs client certificates", flag, flag))
	}
	if f.TrustedCAFile != "" && f.CertFile == "" {
		errs = append(errs, fmt.Errorf("--%strusted-ca-file without --%scert-file: a listener verifies client certificates only over TLS", flag, flag))
	}
	for _, p := range []struct{ flag, path string }{{"cert-file", f.CertFile}, {"key-file", f.KeyFile}, {"trusted-ca-file", f.TrustedCAFile}} {
		if p.path == "" {
			continue
		}
		if _, err := os.Stat(p.path); err != nil {
			errs = append(errs, fmt.Errorf("--%s%s %q: %w", flag, p.flag, p.path, unwrapPath(err)))
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

// Reloader holds the current TLS material of a Files and re-reads it when
// a file's size or modification time changes (checked at most once per
// second, at a handshake). A file that cannot be read or parsed, such as a
// certificate written before its key, leaves the previous material in use
// and is logged; the next handshake tries again.
type Reloader struct {
	files Files
	log   *slog.Logger
	base  *tls.Config

	mu      sync.Mutex
	checked time.Time
	stamps  [3]stamp
	cert    *tls.Certificate
	pool    *x509.CertPool
	cur     *tls.Config
}

// minCheck is the least time between two checks of the files.
const minCheck = time.Second

// NewReloader loads the files once (an error names the file) and returns
// a Reloader.
func NewReloader(f Files, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{files: f, log: log, base: &tls.Config{MinVersion: tls.VersionTLS12}}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
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

// load reads every file; on error nothing changes.
func (r *Reloader) load() error {
	st, err := r.stampsNow()
	if err != nil {
		return err
	}
	var cert *tls.Certificate
	if r.files.CertFile != "" {
		c, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
		if err != nil {
			return fmt.Errorf("load certificate %s and key %s: %w", r.files.CertFile, r.files.KeyFile, err)
		}
		if c.Leaf == nil && len(c.Certificate) > 0 {
			c.Leaf, _ = x509.ParseCertificate(c.Certificate[0])
		}
		cert = &c
	}
	var pool *x509.CertPool
	if r.files.TrustedCAFile != "" {
		pem, err := os.ReadFile(r.files.TrustedCAFile)
		if err != nil {
			return fmt.Errorf("read CA file %s: %w", r.files.TrustedCAFile, err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("CA file %s holds no PEM certificate", r.files.TrustedCAFile)
		}
	}
	r.stamps, r.cert, r.pool = st, cert, pool
	r.cur = nil
	return nil
}

// refresh re-reads the files if they changed.
func (r *Reloader) refresh() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
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
	if err := r.load(); err != nil {
		r.log.Warn("TLS files changed but cannot be loaded; keeping the previous certificates until they can", "err", err)
		return
	}
	r.log.Info("TLS files changed; new connections use them", "cert", r.files.CertFile, "ca", r.files.TrustedCAFile)
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
