package etcd

import (
	"context"
	"errors"
	"fmt"

	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcCode returns the gRPC code of an etcd client error.
func grpcCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	return status.Code(err)
}

// wrap maps an error of the etcd client, for the operation what (e.g.
// `put "/k"`) called with the caller's context parent (c is the context
// the call ran with), to the store sentinels, with short context.
func (s *Store) wrap(parent, c context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	werr := s.wrapErr(parent, c, what, err)
	if s.prober != nil && errors.Is(werr, store.ErrUnavailable) {
		s.prober.suspect() // a member may hang: probe them all
	}
	return werr
}

func (s *Store) wrapErr(parent, c context.Context, what string, err error) error {
	cause := context.Cause(c)
	if s.closed.Load() || errors.Is(cause, errClosedDuringCall) {
		return fmt.Errorf("etcd %s: %w", what, store.ErrClosed)
	}
	if errors.Is(cause, errRequestTimeout) {
		return fmt.Errorf("%w: etcd %s: no answer from %s within %v (RequestTimeout)", store.ErrUnavailable, what, s.endpoints, s.requestTimeout)
	}
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: etcd %s", store.ErrLeaseNotFound, what)
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: etcd %s", store.ErrCompacted, what)
	case errors.Is(err, rpctypes.ErrKeyNotFound):
		// A write that keeps the key's lease (ignore_lease) needs the key.
		return fmt.Errorf("%w: etcd %s", store.ErrNotFound, what)
	}
	if perr := parent.Err(); perr != nil {
		// The caller's context ended first. A deadline means the cluster
		// did not answer in time; a cancellation is the caller's choice.
		if errors.Is(perr, context.DeadlineExceeded) {
			return fmt.Errorf("%w: etcd %s: no answer from %s before the caller's deadline: %w", store.ErrUnavailable, what, s.endpoints, perr)
		}
		return fmt.Errorf("etcd %s: %w", what, perr)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: etcd %s: no answer from %s within %v (RequestTimeout): %w", store.ErrUnavailable, what, s.endpoints, s.requestTimeout, err)
	}
	switch grpcCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("%w: etcd %s at %s: %w", store.ErrUnavailable, what, s.endpoints, err)
	case codes.Canceled:
		// Not the caller's cancellation: the connection or the client
		// was closed under the call.
		if s.cli.Ctx().Err() != nil {
			return fmt.Errorf("etcd %s: %w: the etcd client was closed", what, store.ErrClosed)
		}
		return fmt.Errorf("%w: etcd %s at %s: %w", store.ErrUnavailable, what, s.endpoints, err)
	}
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return fmt.Errorf("%w: etcd %s: %w%s", store.ErrPermissionDenied, what, err, hint(err))
	case unauthenticated(err):
		return fmt.Errorf("%w: etcd %s: %w%s", store.ErrUnauthenticated, what, err, hint(err))
	}
	return fmt.Errorf("etcd %s: %w%s", what, err, hint(err))
}

// unauthenticated reports etcd's refusals of the caller's credentials.
func unauthenticated(err error) bool {
	for _, e := range []error{rpctypes.ErrUserEmpty, rpctypes.ErrInvalidAuthToken, rpctypes.ErrAuthFailed,
		rpctypes.ErrAuthOldRevision} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// hint says what to do about the etcd errors a Beacon user can fix.
func hint(err error) string {
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return " (the etcd user's roles lack permission on this key range)"
	case errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrAuthFailed):
		return " (etcd requires authentication: check Username and Password, " + EnvUsername + " and " + EnvPassword + ")"
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return " (over the server's --max-request-bytes, 1.5 MiB by default: write fewer or smaller values at once)"
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return " (over the server's --max-txn-ops, 128 by default: split the transaction)"
	case errors.Is(err, rpctypes.ErrNoSpace):
		return " (the cluster's storage quota is full: compact, defragment and disarm the NOSPACE alarm)"
	}
	return ""
}
