package proxy

import (
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// credentialError reports etcd's refusals of a client's token: retrying
// with the same token cannot succeed; the client must authenticate again.
func credentialError(err error) bool {
	err = rpctypes.Error(err)
	return errors.Is(err, rpctypes.ErrInvalidAuthToken) || errors.Is(err, rpctypes.ErrAuthOldRevision) ||
		errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrAuthFailed)
}

// retire removes an upstream keep-alive stream whose credentials etcd
// refuses and ends its clients' streams with err; clients with new tokens
// get a new upstream.
func (up *kaUpstream) retire(err error) {
	lm := up.mux
	lm.mu.Lock()
	if lm.ups[up.key] == up {
		delete(lm.ups, up.key)
	}
	lm.mu.Unlock()
	up.failAll(err)
	up.cancel()
}
