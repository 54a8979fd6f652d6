package health

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/beaconplane/beacon"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// maxBody is how much of an HTTP check's answer is read (and then
// dropped): enough to reuse the connection, bounded against a huge body.
const maxBody = 4 << 10

// Prober probes instances' addresses. Its zero value is ready to use.
type Prober struct {
	// HTTP is the client of HTTP checks; nil uses one with redirects off
	// (a check judges the address it was given, not another).
	HTTP *http.Client
	// Dialer opens TCP checks' connections; nil uses a net.Dialer.
	Dialer *net.Dialer
}

// Probe runs one probe of c against addr within c's timeout and returns
// nil if it passed, else why not. A TTL check is not probed: Probe refuses
// it.
func (p *Prober) Probe(ctx context.Context, c beacon.Check, addr string) error {
	c = c.WithDefaults()
	return withTimeout(ctx, c.Timeout, func(ctx context.Context) error {
		switch c.Kind {
		case beacon.CheckHTTP:
			return p.probeHTTP(ctx, addr, c.Path)
		case beacon.CheckTCP:
			return p.probeTCP(ctx, addr)
		case beacon.CheckGRPC:
			return probeGRPC(ctx, addr, c.Service)
		}
		return fmt.Errorf("health: a %s check is reported by the service, not probed", c.Kind)
	})
}

// withTimeout runs probe within timeout and says so when it found no
// answer in time (a gRPC call says it with its status code
// DeadlineExceeded, which is not context.DeadlineExceeded).
func withTimeout(ctx context.Context, timeout time.Duration, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := probe(ctx)
	timedOut := errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
	// gRPC ends a call at the deadline by its own timer, which can fire
	// before the context's: the deadline passed is the test, not ctx.Err.
	deadline, _ := ctx.Deadline()
	if err != nil && timedOut && (ctx.Err() != nil || !time.Now().Before(deadline)) {
		return fmt.Errorf("no answer within the check's timeout (%s)", timeout)
	}
	return err
}

func (p *Prober) probeHTTP(ctx context.Context, addr, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "beacon-health-check")
	client := p.HTTP
	if client == nil {
		client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	resp, err := client.Do(req)
	if err != nil {
		return httpError(err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		if resp.StatusCode == http.StatusBadRequest && complainsOfPlaintext(body) {
			return fmt.Errorf("GET %s answered %s: %w", path, resp.Status, errTLSOnly)
		}
		return fmt.Errorf("GET %s answered %s", path, resp.Status)
	}
	return nil
}

// errTLSOnly: the server answered a plaintext request as a TLS-only one.
// Checks speak plaintext only (they have no certificates to trust, nor a
// name to verify): every failure that points to TLS wraps it.
var errTLSOnly = errors.New("the server speaks TLS only, and checks speak plaintext (h2c for gRPC): serve the health endpoint without TLS on a port of its own, or use a tcp check")

// complainsOfPlaintext reports whether an HTTP 400's body is a TLS
// server's answer to plaintext: Go's net/http and nginx say so.
func complainsOfPlaintext(body []byte) bool {
	return bytes.Contains(body, []byte("HTTP request to an HTTPS server")) ||
		bytes.Contains(body, []byte("plain HTTP request was sent to HTTPS port"))
}

// httpError says what an HTTP check's failed request means: a TLS record
// where an HTTP answer was due is a TLS-only server's (an alert: OpenSSL
// and others answer plaintext so); a connection closed without an answer
// may be one (Go's crypto/tls closes it so, as it does for gRPC).
func httpError(err error) error {
	const malformed = "malformed HTTP response "
	if _, quoted, ok := strings.Cut(err.Error(), malformed); ok {
		if q, qerr := strconv.QuotedPrefix(quoted); qerr == nil {
			if answer, uerr := strconv.Unquote(q); uerr == nil && isTLSRecord([]byte(answer)) {
				return fmt.Errorf("%w (the server answered with a TLS record: %w)", err, errTLSOnly)
			}
		}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return mayBeTLSOnly(err, "the server closed the connection without an HTTP answer")
	}
	return err
}

// isTLSRecord reports whether b starts as a TLS record does: its content
// type (20 change_cipher_spec, 21 alert, 22 handshake, 23 application
// data) and the major version 3 (SSL 3.0 to TLS 1.3 all say 3).
func isTLSRecord(b []byte) bool {
	return len(b) >= 2 && b[0] >= 20 && b[0] <= 23 && b[1] == 3
}

// mayBeTLSOnly adds to err that the server, which did what did says, may
// be TLS-only: the one hint of every kind whose server closed a plaintext
// connection on it.
func mayBeTLSOnly(err error, did string) error {
	return fmt.Errorf("%w (%s: it may be TLS-only, %w)", err, did, errTLSOnly)
}

func (p *Prober) probeTCP(ctx context.Context, addr string) error {
	d := p.Dialer
	if d == nil {
		d = &net.Dialer{}
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// probeGRPC calls grpc.health.v1.Health/Check once on a connection of its
// own.
func probeGRPC(ctx context.Context, addr, service string) error {
	cc, err := dialGRPC(addr)
	if err != nil {
		return err
	}
	defer func() { _ = cc.Close() }()
	return checkGRPC(ctx, cc, service)
}

// checkGRPC calls grpc.health.v1.Health/Check once on cc.
func checkGRPC(ctx context.Context, cc *grpc.ClientConn, service string) error {
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return grpcError(service, err)
	}
	return servingError(service, resp.GetStatus())
}

func dialGRPC(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent("beacon-health-check"))
}

// errUnimplemented: the server does not serve the method called.
var errUnimplemented = errors.New("the server does not serve grpc.health.v1.Health (register its health service, or use a tcp check)")

// grpcError says what a failed health RPC means for the check.
func grpcError(service string, err error) error {
	switch status.Code(err) {
	case codes.Unimplemented:
		return errUnimplemented
	case codes.NotFound:
		return fmt.Errorf("the server does not know the service %q (SERVICE_UNKNOWN)", service)
	case codes.Unavailable:
		if strings.Contains(err.Error(), "error reading server preface") {
			// A TLS server closes a connection that does not start with a
			// TLS handshake; so does any server that is not HTTP/2.
			return mayBeTLSOnly(err, "the server closed the connection before speaking HTTP/2")
		}
	}
	return err
}

// servingError is nil for SERVING, else why the status fails the check.
func servingError(service string, s healthpb.HealthCheckResponse_ServingStatus) error {
	switch s {
	case healthpb.HealthCheckResponse_SERVING:
		return nil
	case healthpb.HealthCheckResponse_SERVICE_UNKNOWN:
		return fmt.Errorf("the server does not know the service %q (SERVICE_UNKNOWN)", service)
	}
	return fmt.Errorf("the server reports %s", s)
}

// WatchGRPC follows grpc.health.v1.Health/Watch for service at addr and
// sends the first status the server pushes and then each change (nil for
// SERVING, else why not) on out, until ctx ends or the stream fails; it
// returns why it ended. A status pushed again unchanged is not sent: some
// servers (grpc-js's grpc-health-check, grpcio-health-checking's) push
// every status their application sets, a repeated one too, and a repeat is
// no new result. A server without Watch answers Unimplemented: the caller
// then polls with Probe.
func WatchGRPC(ctx context.Context, addr, service string, out chan<- error) error {
	cc, err := dialGRPC(addr)
	if err != nil {
		return err
	}
	defer func() { _ = cc.Close() }()
	return watchGRPC(ctx, cc, service, out)
}

// watchGRPC is WatchGRPC on cc.
func watchGRPC(ctx context.Context, cc *grpc.ClientConn, service string, out chan<- error) error {
	stream, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return grpcError(service, err)
	}
	for first, last := true, healthpb.HealthCheckResponse_UNKNOWN; ; first = false {
		resp, err := stream.Recv()
		if err != nil {
			return grpcError(service, err)
		}
		if !first && resp.GetStatus() == last {
			continue // pushed again unchanged
		}
		last = resp.GetStatus()
		select {
		case out <- servingError(service, last):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
