package v2

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/beaconplane/beacon/bootstrap"
)

// DefaultSize is the cluster size of /new without a size parameter (as on
// discovery.etcd.io).
const DefaultSize = 3

// ParseSizeParam parses the size parameter of /new: empty means
// DefaultSize; otherwise a decimal integer from 1 to bootstrap.MaxSize,
// digits only (no sign: "+3" is refused, as strconv.ParseUint refuses it).
func ParseSizeParam(s string) (int, error) {
	if s == "" {
		return DefaultSize, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || s[0] < '0' || s[0] > '9' {
		return 0, fmt.Errorf("%w: size %q is not a whole number: use e.g. /new?size=3", bootstrap.ErrInvalidSize, s)
	}
	if err := bootstrap.ValidateSize(n); err != nil {
		return 0, err
	}
	return n, nil
}

// keyRequest is the query of a keys API request, parsed as etcd's v2 HTTP
// API parses it.
type keyRequest struct {
	wait      bool
	waitIndex int64
	recursive bool
	// prevExist: nil when absent.
	prevExist *bool
}

// unsupported lists parameters of etcd's keys API that etcd's discovery
// client never sends; this service refuses them rather than ignore them.
var unsupported = []string{"ttl", "prevValue", "prevIndex", "dir", "refresh", "stream", "noValueOnSuccess"}

// parseKeyRequest reads the parameters; errors are etcd v2 errors with
// etcd's codes and causes.
func parseKeyRequest(form url.Values, method string) (keyRequest, *Error) {
	var kr keyRequest
	var err error
	if kr.recursive, err = getBool(form, "recursive"); err != nil {
		return kr, newError(EcodeInvalidField, `invalid value for "recursive"`, 0)
	}
	if kr.wait, err = getBool(form, "wait"); err != nil {
		return kr, newError(EcodeInvalidField, `invalid value for "wait"`, 0)
	}
	if vals, ok := form["waitIndex"]; ok {
		n, err := strconv.ParseUint(vals[0], 10, 63)
		if err != nil {
			return kr, newError(EcodeIndexNaN, `invalid value for "waitIndex"`, 0)
		}
		kr.waitIndex = int64(n)
	}
	for _, name := range []string{"sorted", "quorum"} {
		if _, err := getBool(form, name); err != nil {
			return kr, newError(EcodeInvalidField, fmt.Sprintf("invalid value for %q", name), 0)
		}
	}
	if vals, ok := form["prevExist"]; ok {
		b, err := strconv.ParseBool(vals[0])
		if err != nil {
			return kr, newError(EcodeInvalidField, `invalid value for "prevExist"`, 0)
		}
		kr.prevExist = &b
	}
	if kr.wait && method != "GET" {
		return kr, newError(EcodeInvalidField, `"wait" can only be used with GET requests`, 0)
	}
	for _, name := range unsupported {
		if _, ok := form[name]; ok {
			return kr, newError(EcodeInvalidField, fmt.Sprintf("%q is not supported by this discovery service", name), 0)
		}
	}
	return kr, nil
}

func getBool(form url.Values, key string) (bool, error) {
	vals, ok := form[key]
	if !ok || len(vals) == 0 {
		return false, nil
	}
	return strconv.ParseBool(vals[0])
}
