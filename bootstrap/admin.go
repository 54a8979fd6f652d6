package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CreateToken creates a token for a cluster of size members: it writes the
// size key (and CreatedKey, the time of creation, which etcd ignores),
// only if nothing at all exists under the token yet, and returns the
// revision of the write. A token that exists (even only partly, or
// already used) gives ErrTokenExists: tokens are single-use. The token is
// checked with ValidateToken and the size with ValidateSize; use NewToken
// for a fresh one. Give ctx a deadline.
func CreateToken(ctx context.Context, cli *clientv3.Client, token string, size int) (int64, error) {
	if err := ValidateToken(token); err != nil {
		return 0, err
	}
	if err := ValidateSize(size); err != nil {
		return 0, err
	}
	prefix := TokenPrefix(token)
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(prefix).WithPrefix(), "=", 0)).
		Then(clientv3.OpPut(SizeKey(token), strconv.Itoa(size)),
			clientv3.OpPut(CreatedKey(token), time.Now().UTC().Format(time.RFC3339Nano))).
		Else(clientv3.OpGet(prefix, clientv3.WithPrefix())).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("bootstrap: create token %q: %w", token, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	detail := "it holds keys"
	if get := resp.Responses[0].GetResponseRange(); get != nil {
		reg := newRegistry(token)
		for _, kv := range get.Kvs {
			switch key := string(kv.Key); {
			case key == SizeKey(token):
				detail = fmt.Sprintf("size %s", kv.Value)
			case strings.HasPrefix(key, MembersPrefix(token)):
				reg.put(key, string(kv.Value), kv.CreateRevision)
			}
		}
		detail += fmt.Sprintf(", %d members registered", len(reg.members))
	}
	return 0, fmt.Errorf("%w: %q (%s): a token bootstraps one cluster only; create a new one", ErrTokenExists, token, detail)
}

// TokenStatus reads a token's registry. A token with no keys at all gives
// ErrTokenNotFound. If the size key is missing or bad the error matches
// ErrSizeNotFound or ErrBadSizeKey and the Status still lists the
// registrations found.
func TokenStatus(ctx context.Context, cli *clientv3.Client, token string) (Status, error) {
	if err := ValidateToken(token); err != nil {
		return Status{}, err
	}
	reg, err := readRegistry(ctx, cli, token, DefaultRequestTimeout)
	if err != nil {
		return Status{}, fmt.Errorf("bootstrap: read token %q: %w", token, err)
	}
	st := reg.status()
	if reg.sizeErr != nil {
		if errors.Is(reg.sizeErr, ErrSizeNotFound) && len(reg.members) == 0 && len(reg.skipped) == 0 {
			return Status{}, fmt.Errorf("%w: %q: nothing is registered under %s", ErrTokenNotFound, token, TokenPrefix(token))
		}
		return st, reg.sizeErr
	}
	return st, nil
}

// RemoveToken deletes every key of the token (its size and all
// registrations) and returns how many it deleted; a token with no keys
// gives ErrTokenNotFound. Members still waiting on the token fail with
// ErrSizeNotFound.
func RemoveToken(ctx context.Context, cli *clientv3.Client, token string) (int64, error) {
	if err := ValidateToken(token); err != nil {
		return 0, err
	}
	resp, err := cli.Delete(ctx, TokenPrefix(token), clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("bootstrap: remove token %q: %w", token, err)
	}
	if resp.Deleted == 0 {
		return 0, fmt.Errorf("%w: %q: nothing is registered under %s", ErrTokenNotFound, token, TokenPrefix(token))
	}
	return resp.Deleted, nil
}

// MemberFlags returns the flags that make etcd (3.6 or later) or
// `beacon serve` bootstrap through the token:
// "--discovery-token=<token> --discovery-endpoints=<e1,e2>".
func MemberFlags(token string, endpoints []string) string {
	return "--discovery-token=" + token + " --discovery-endpoints=" + strings.Join(endpoints, ",")
}
