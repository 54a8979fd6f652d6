package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// diagnoseTimeout bounds the diagnosis of one endpoint.
const diagnoseTimeout = time.Second

// diagnose runs when Open could not reach the cluster: the etcd client only
// reports a deadline, so it checks each endpoint itself (a TCP dial, a TLS
// handshake, and, because a TLS 1.3 server rejects a client certificate
// only after the handshake, a short read) and says what it found and what
// to check.
func diagnose(ctx context.Context, cfg Config, r resolved, tlsCfg *tls.Config) string {
	ctx, cancel := context.WithTimeout(ctx, diagnoseTimeout)
	defer cancel()
	found := make([]string, len(r.endpoints))
	var wg sync.WaitGroup
	for i, ep := range r.endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			found[i] = diagnoseEndpoint(ctx, cfg, ep, tlsCfg)
		}()
	}
	wg.Wait()
	return strings.Join(found, "; ")
}

func diagnoseEndpoint(ctx context.Context, cfg Config, ep string, tlsCfg *tls.Config) string {
	u, err := url.Parse(ep)
	if err != nil { // resolve normalized it
		return ep + ": " + err.Error()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return fmt.Sprintf("%s: %v (is etcd running there, and is %s its client port?)", u.Host, unwrapOpError(err), u.Port())
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if tlsCfg == nil {
		// Does the server expect TLS?
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only probing whether it speaks TLS
		if tc.HandshakeContext(ctx) == nil {
			return fmt.Sprintf("%s speaks TLS: use https:// endpoints, with the CA (%s) and a client certificate (%s, %s) if it requires one", u.Host, EnvCA, EnvClientCert, EnvClientKey)
		}
		return fmt.Sprintf("%s accepts connections but did not answer etcd requests (is it etcd, and does its cluster have a leader?)", u.Host)
	}
	c := tlsCfg.Clone()
	c.ServerName = u.Hostname()
	tc := tls.Client(conn, c)
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Sprintf("%s: TLS handshake failed: %v%s", u.Host, unwrapOpError(err), tlsHint(cfg, err))
	}
	// A healthy HTTP/2 server waits for the client's preface: a timeout
	// here means TLS is fine. An alert means it refused our certificate.
	_ = tc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var b [1]byte
	_, err = tc.Read(b[:])
	var ne net.Error
	if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Sprintf("%s refused the TLS connection: %v%s", u.Host, unwrapOpError(err), clientCertHint(cfg))
	}
	return fmt.Sprintf("%s: TLS works but etcd did not answer (does its cluster have a leader?)", u.Host)
}

func tlsHint(cfg Config, err error) string {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
	)
	switch {
	case strings.Contains(err.Error(), "first record does not look like a TLS handshake"), errors.Is(err, io.EOF):
		return " (the server does not speak TLS: use http:// endpoints and no TLS files)"
	case errors.As(err, &unknown):
		if cfg.CA == "" {
			return fmt.Sprintf(" (no system root signed the server's certificate: set CA, %s, to its CA file)", EnvCA)
		}
		return fmt.Sprintf(" (the CA file %s, %s, did not sign the server's certificate)", cfg.CA, EnvCA)
	case errors.As(err, &hostname):
		return " (the server's certificate is not valid for this host name: use an endpoint its certificate names)"
	case errors.As(err, &invalid):
		return " (the server's certificate is invalid, e.g. expired)"
	case errors.As(err, &verify):
		return " (the server's certificate did not verify)"
	case strings.Contains(err.Error(), "remote error"):
		return clientCertHint(cfg)
	}
	return ""
}

func clientCertHint(cfg Config) string {
	if cfg.ClientCert == "" {
		return fmt.Sprintf(" (the server requires a client certificate: set ClientCert and ClientKey, %s and %s)", EnvClientCert, EnvClientKey)
	}
	return fmt.Sprintf(" (the server did not accept the client certificate %s, %s: is it signed by the server's client CA?)", cfg.ClientCert, EnvClientCert)
}

// unwrapOpError drops net.OpError's "dial tcp ...:" prefix when it only
// repeats the address.
func unwrapOpError(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		var se *os.SyscallError
		if errors.As(oe.Err, &se) {
			return se.Err
		}
		return oe.Err
	}
	return err
}
