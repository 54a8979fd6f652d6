package bootstrap

import (
	"errors"
	"fmt"
)

// Protocol errors. Their messages are exactly those of etcd's v3 discovery
// (server/etcdserver/api/v3discovery), so that logs, alerts and scripts
// written for etcd read the same with Beacon. Beacon wraps them with detail
// (which token, which members); match them with errors.Is.
var (
	// ErrInvalidURL: the registered members' values do not form a valid
	// initial cluster (a peer URL does not parse as etcd requires).
	ErrInvalidURL = errors.New("discovery: invalid peer URL")
	// ErrBadSizeKey: the size key is not a base-10 integer greater than 0.
	ErrBadSizeKey = errors.New("discovery: size key is bad")
	// ErrSizeNotFound: the token has no size key (it was never created,
	// or it was removed).
	ErrSizeNotFound = errors.New("discovery: size key not found")
	// ErrFullCluster: the first size members have registered and this
	// member is not among them. A token bootstraps one cluster only.
	ErrFullCluster = errors.New("discovery: cluster is full")
	// ErrDuplicateName: two of the first size members share a name. This is
	// etcd v2 discovery's message; etcd v3 discovery does not check and its
	// members then fail later with a less helpful error.
	ErrDuplicateName = errors.New("discovery: found duplicate name")
)

// Beacon's own errors.
var (
	// ErrInvalidToken: a token that is empty, too long, or has characters
	// outside [A-Za-z0-9._-] (see ValidateToken).
	ErrInvalidToken = errors.New("bootstrap: invalid token")
	// ErrInvalidSize: a cluster size that is not an integer in [1, MaxSize].
	ErrInvalidSize = errors.New("bootstrap: invalid cluster size")
	// ErrInvalidMember: a member name or peer URL list that etcd would
	// refuse or that would corrupt the registry format.
	ErrInvalidMember = errors.New("bootstrap: invalid member")
	// ErrInvalidConfig: a Config that fails Validate.
	ErrInvalidConfig = errors.New("bootstrap: invalid config")
	// ErrDuplicateURL: a peer URL that two members claim.
	ErrDuplicateURL = errors.New("bootstrap: duplicate peer URL")
	// ErrTokenExists: CreateToken found the token already in use.
	ErrTokenExists = errors.New("bootstrap: token already exists")
	// ErrTokenNotFound: nothing is registered under the token.
	ErrTokenNotFound = errors.New("bootstrap: token not found")
	// ErrUnavailable wraps failures to reach the discovery service that
	// Join and GetCluster retried until their context ended.
	ErrUnavailable = errors.New("bootstrap: discovery service unavailable")
	// ErrAccessDenied: the discovery service refused the credentials
	// (wrong user or password, or no permission on the registry keys).
	// It is not retried.
	ErrAccessDenied = errors.New("bootstrap: discovery service denied access")
)

func invalid(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

func invalidValue(sentinel error, value, rule string) error {
	return fmt.Errorf("%w (value %q: %s)", sentinel, shorten(value), shorten(rule))
}
