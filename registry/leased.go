package registry

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// Registrations made on behalf of remote clients.
//
// A server that registers instances for remote clients (Beacon's HTTP API)
// cannot use the session: each client must vanish when *it* stops
// heartbeating, so each registration gets a lease of its own. And a lease
// ID is no credential: etcd hands them out in sequence, so anyone could
// guess one. RegisterWithTTL therefore returns a Secret, 256 bits from
// crypto/rand, shown once; the store keeps only its SHA-256, in an
// ownership record bound to the registration's lease under the keyspace's
// OwnersPrefix (which the registry never lists), so that every server in
// front of the same store can check it. Heartbeat, UpdateLeased and
// DeregisterLeased require the secret:
//
//	o, err := r.RegisterWithTTL(ctx, in, 15*time.Second)     // grant + create-if-absent
//	ttl, err := r.Heartbeat(ctx, o.Instance.Ref(), o.Secret)  // keep alive
//	in, err = r.UpdateLeased(ctx, ref, o.Secret, mutate)      // compare-and-swap
//	err = r.DeregisterLeased(ctx, ref, o.Secret)              // revoke its lease
//
// A wrong or missing secret, an instance without an ownership record (one
// registered through a session, by the Go library or `beacon register`),
// an unknown instance and one whose lease ended all give the same error,
// matching beacon.ErrNotFound with the same message, after a constant-time
// comparison: the answer tells a guesser nothing. These calls act only on
// the lease recorded for the registration, never on a lease a caller
// names, so a session's lease cannot be kept alive or revoked through them.
//
// Other errors: a bad instance or TTL matches beacon.ErrInvalid or
// ErrInvalidTTL; an ID held by another registration
// beacon.ErrAlreadyRegistered (the message does not reveal the holder's
// lease); an unreachable store store.ErrUnavailable; a store user without
// permission store.ErrPermissionDenied.

// SecretBytes is the number of random bytes in a Secret.
const SecretBytes = 32

// Secret proves the ownership of a registration made with RegisterWithTTL.
// It prints as REDACTED (String, LogValue); use string(s) to send it to
// its owner.
type Secret string

// String redacts the secret, so that it never reaches a log by accident.
func (Secret) String() string { return "REDACTED" }

// LogValue redacts the secret.
func (Secret) LogValue() slog.Value { return slog.StringValue("REDACTED") }

// NewSecret returns SecretBytes random bytes from crypto/rand, base64url
// encoded.
func NewSecret() Secret {
	b := make([]byte, SecretBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return Secret(base64.RawURLEncoding.EncodeToString(b))
}

// hash returns the SHA-256 of the secret. The secret carries 256 random
// bits, so a fast hash is enough: there is nothing to brute-force.
func (s Secret) hash() [sha256.Size]byte { return sha256.Sum256([]byte(s)) }

// Owned is a registration made with RegisterWithTTL.
type Owned struct {
	// Instance is the instance as written.
	Instance beacon.Instance
	// Lease is the registration's own lease (informational: no call
	// accepts a lease ID as proof of ownership).
	Lease store.Lease
	// Secret is the only proof of ownership. It is returned once; the
	// store keeps its hash.
	Secret Secret
}

// ownerRecord is the value stored at the ownership key of a lease.
type ownerRecord struct {
	// Ref is the registration the lease was granted for.
	Ref string `json:"ref"`
	// SHA256 is the hex SHA-256 of the registration's secret.
	SHA256 string `json:"sha256"`
}

// ownerKey is the key of the ownership record of lease, under the
// registration's namespace.
func (r *StoreRegistry) ownerKey(ns string, lease store.LeaseID) string {
	return r.ks.OwnersPrefix(ns) + fmt.Sprintf("%016x", uint64(lease))
}

// notFound is the one answer to every failed proof of ownership: the same
// error as an unknown instance.
func notFound(ref beacon.Ref) error { return fmt.Errorf("%w: %s", beacon.ErrNotFound, ref) }

// GrantLease grants a lease with the given TTL, within [MinLeaseTTL,
// MaxLeaseTTL], for an in-process caller to keep alive (RegisterLeased).
func (r *StoreRegistry) GrantLease(ctx context.Context, ttl time.Duration) (store.Lease, error) {
	if err := r.refuseWrite("grant a lease"); err != nil {
		return store.Lease{}, err
	}
	if err := ValidateTTL(ttl); err != nil {
		return store.Lease{}, err
	}
	if r.closed.Load() {
		return store.Lease{}, ErrClosed
	}
	l, err := r.st.Grant(ctx, ttl)
	if err != nil {
		return store.Lease{}, fmt.Errorf("registry: grant lease: %w", err)
	}
	r.leased.granted(l.ID, l.TTL)
	return l, nil
}

// KeepAliveLease renews a lease the in-process caller granted and returns
// its TTL. A lease that ended gives an error matching beacon.ErrNotFound
// and store.ErrLeaseNotFound. It trusts the caller: never pass it a lease
// ID received from a remote client (use Heartbeat).
func (r *StoreRegistry) KeepAliveLease(ctx context.Context, id store.LeaseID) (time.Duration, error) {
	if err := r.refuseWrite("keep a lease alive"); err != nil {
		return 0, err
	}
	if err := r.checkLease(id); err != nil {
		return 0, err
	}
	ttl, err := r.st.KeepAlive(ctx, id)
	if err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			r.leased.ended(id)
		}
		return 0, leaseError("keep alive", id, err)
	}
	r.leased.renewed(id, ttl)
	return ttl, nil
}

// RevokeLease ends a lease the in-process caller granted, deleting every
// key bound to it. A lease that already ended gives an error matching
// beacon.ErrNotFound. It trusts the caller: never pass it a lease ID
// received from a remote client (use DeregisterLeased).
func (r *StoreRegistry) RevokeLease(ctx context.Context, id store.LeaseID) error {
	if err := r.refuseWrite("revoke a lease"); err != nil {
		return err
	}
	if err := r.checkLease(id); err != nil {
		return err
	}
	if err := r.st.Revoke(ctx, id); err != nil {
		if errors.Is(err, store.ErrLeaseNotFound) {
			r.leased.ended(id)
		}
		return leaseError("revoke", id, err)
	}
	r.leased.ended(id)
	return nil
}

func (r *StoreRegistry) checkLease(id store.LeaseID) error {
	if r.closed.Load() {
		return ErrClosed
	}
	if id == store.NoLease {
		return fmt.Errorf("%w: lease 0: a caller-owned lease is required", beacon.ErrInvalid)
	}
	if r.sess.ours(id) {
		return fmt.Errorf("%w: lease %x is the registry's own session lease", ErrLeaseMismatch, id)
	}
	return nil
}

func leaseError(op string, id store.LeaseID, err error) error {
	if errors.Is(err, store.ErrLeaseNotFound) {
		return fmt.Errorf("registry: %s lease %x: %w (%w)", op, id, beacon.ErrNotFound, err)
	}
	return fmt.Errorf("registry: %s lease %x: %w", op, id, err)
}

// alreadyRegistered reports an ID held by someone else without saying who
// holds it or with which lease.
func alreadyRegistered(ref beacon.Ref) error {
	return fmt.Errorf("%w: %s is held by another live registration; choose another ID, or leave the ID empty to get a fresh one",
		beacon.ErrAlreadyRegistered, ref)
}

// RegisterLeased writes an instance bound to a lease the in-process caller
// owns and keeps alive (GrantLease, KeepAliveLease); several instances may
// share one lease. Empty fields are filled as by Register and the instance
// is validated; the write is create-if-absent, so an ID held by anyone
// gives beacon.ErrAlreadyRegistered. It returns the instance as written
// and the revision of the write. Instances written this way have no
// ownership record: the HTTP API cannot act on them.
func (r *StoreRegistry) RegisterLeased(ctx context.Context, in beacon.Instance, lease store.LeaseID) (beacon.Instance, int64, error) {
	if err := r.refuseWrite("register an instance"); err != nil {
		return beacon.Instance{}, 0, err
	}
	if err := r.checkLease(lease); err != nil {
		return beacon.Instance{}, 0, err
	}
	in, val, err := r.prepare(in, r.leased.leaseTTL(lease))
	if err != nil {
		return beacon.Instance{}, 0, err
	}
	key := r.ks.Key(in.Ref())
	rev, err := r.st.Create(ctx, key, val, store.WithLease(lease))
	switch {
	case err == nil:
		r.leased.registered(lease, in.Ref())
		return in.Clone(), rev, nil
	case errors.Is(err, store.ErrKeyExists):
		return beacon.Instance{}, 0, alreadyRegistered(in.Ref())
	case errors.Is(err, store.ErrLeaseNotFound):
		return beacon.Instance{}, 0, leaseError("register with", lease, err)
	}
	return beacon.Instance{}, 0, fmt.Errorf("registry: register %s: %w", in.Ref(), err)
}

// RegisterWithTTL grants a lease with ttl and writes, in one transaction,
// the instance and its ownership record, both bound to it. It returns the
// instance, the lease and the secret that Heartbeat, UpdateLeased and
// DeregisterLeased require. If anything fails, the lease is revoked:
// nothing is left half-done.
func (r *StoreRegistry) RegisterWithTTL(ctx context.Context, in beacon.Instance, ttl time.Duration) (Owned, error) {
	if err := r.refuseWrite("register an instance"); err != nil {
		return Owned{}, err
	}
	if err := ValidateTTL(ttl); err != nil {
		return Owned{}, err
	}
	// Validate before granting, so that bad input costs no lease.
	in, val, err := r.prepare(in, ttl)
	if err != nil {
		return Owned{}, err
	}
	l, err := r.GrantLease(ctx, ttl)
	if err != nil {
		return Owned{}, err
	}
	secret := NewSecret()
	if err := r.writeOwned(ctx, in, val, l.ID, secret); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
		defer cancel()
		r.leased.ended(l.ID)
		if rerr := r.st.Revoke(rctx, l.ID); rerr != nil && !errors.Is(rerr, store.ErrLeaseNotFound) {
			r.log.Warn("revoking the lease of a failed registration failed; it expires by itself",
				"instance", in.Ref().String(), "ttl", l.TTL, "err", rerr)
		}
		return Owned{}, err
	}
	r.leased.registered(l.ID, in.Ref())
	r.leased.prove(l.ID, in.Ref(), secret.hash())
	return Owned{Instance: in.Clone(), Lease: l, Secret: secret}, nil
}

// writeOwned creates the ownership record and the instance, both bound to
// lease.
func (r *StoreRegistry) writeOwned(ctx context.Context, in beacon.Instance, val []byte, lease store.LeaseID, secret Secret) error {
	ref := in.Ref()
	h := secret.hash()
	rec, err := json.Marshal(ownerRecord{Ref: ref.String(), SHA256: hex.EncodeToString(h[:])})
	if err != nil {
		return fmt.Errorf("registry: encode ownership record: %w", err)
	}
	okey, key := r.ownerKey(ref.Namespace, lease), r.ks.Key(ref)
	fo := r.newFailover()
	for {
		err = r.createOwned(ctx, okey, rec, key, val, lease)
		if err != nil && fo.tries > 0 && r.holds(ctx, lease, okey, rec, key, val) {
			return nil // an earlier attempt landed; its answer was lost
		}
		if !fo.again(ctx, err) {
			break
		}
	}
	var ce *store.ConflictError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce) && ce.Key == okey, errors.Is(err, store.ErrKeyExists) && r.tx == nil && r.ownerExists(ctx, okey):
		// A fresh lease cannot have a record: someone wrote one ahead.
		return fmt.Errorf("registry: register %s: the ownership record %s of a fresh lease already exists (written by someone else)", ref, okey)
	case errors.Is(err, store.ErrKeyExists):
		return alreadyRegistered(ref)
	}
	return fmt.Errorf("registry: register %s: %w", ref, err)
}

// createOwned creates the ownership record okey and the instance key,
// both bound to lease: in one transaction when the store has them.
func (r *StoreRegistry) createOwned(ctx context.Context, okey string, rec []byte, key string, val []byte, lease store.LeaseID) error {
	if r.tx != nil {
		_, err := r.tx.Txn(ctx,
			store.Op{Kind: store.OpPut, Key: okey, Value: rec, Lease: lease, IfAbsent: true},
			store.Op{Kind: store.OpPut, Key: key, Value: val, Lease: lease, IfAbsent: true})
		return err
	}
	_, err := r.st.Create(ctx, okey, rec, store.WithLease(lease))
	if err == nil {
		_, err = r.st.Create(ctx, key, val, store.WithLease(lease))
	}
	return err
}

// holds reports whether the store holds val at key and rec at okey, both
// under lease: what writeOwned writes.
func (r *StoreRegistry) holds(ctx context.Context, lease store.LeaseID, okey string, rec []byte, key string, val []byte) bool {
	return r.holdsValue(ctx, lease, okey, rec) && r.holdsValue(ctx, lease, key, val)
}

func (r *StoreRegistry) holdsValue(ctx context.Context, lease store.LeaseID, key string, val []byte) bool {
	kv, err := r.st.Get(ctx, key)
	return err == nil && kv.Lease == lease && bytes.Equal(kv.Value, val)
}

func (r *StoreRegistry) ownerExists(ctx context.Context, key string) bool {
	kv, err := r.st.Get(ctx, key)
	return err == nil && kv.Key != ""
}

// errWrongSecret marks a refusal of a registration that has an ownership
// record: a right secret exists (see refuse). It matches
// beacon.ErrNotFound, with notFound's message.
type errWrongSecret struct{ error }

func (e errWrongSecret) Unwrap() error { return e.error }

// owns checks that secret proves the ownership of the registration at ref,
// stored as kv. It returns notFound(ref) when no secret could (no
// ownership record: a session's instance, a lease that ended),
// errWrongSecret when the record is there and secret does not fit it, or
// the store's error. Its read is linearizable.
// getOwned reads the registration at ref for action (op in errors), made
// by the caller that presents secret: refused on a read-only layout, and
// refused as refuse says unless the secret is the owner's.
func (r *StoreRegistry) getOwned(ctx context.Context, ref beacon.Ref, secret Secret, action, op string) (beacon.Instance, store.KeyValue, error) {
	if err := r.refuseWrite(action); err != nil {
		return beacon.Instance{}, store.KeyValue{}, err
	}
	in, kv, err := r.get(ctx, ref)
	if err != nil {
		return beacon.Instance{}, store.KeyValue{}, err
	}
	if err := r.owns(ctx, ref, kv, secret); err != nil {
		return beacon.Instance{}, store.KeyValue{}, r.refuse(ctx, op, ref, kv, err)
	}
	return in, kv, nil
}

func (r *StoreRegistry) owns(ctx context.Context, ref beacon.Ref, kv store.KeyValue, secret Secret) error {
	return r.ownsWith(ctx, ref, kv, secret, r.st.Get)
}

// ownsWith is owns, reading the ownership record with read.
func (r *StoreRegistry) ownsWith(ctx context.Context, ref beacon.Ref, kv store.KeyValue, secret Secret, read func(context.Context, string) (store.KeyValue, error)) error {
	presented := secret.hash() // computed on every path
	if kv.Lease == store.NoLease || r.sess.ours(kv.Lease) {
		return notFound(ref)
	}
	okv, err := read(ctx, r.ownerKey(ref.Namespace, kv.Lease))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return notFound(ref)
	case err != nil:
		return fmt.Errorf("registry: read the ownership record of %s: %w", ref, err)
	}
	var rec ownerRecord
	stored, herr := []byte(nil), json.Unmarshal(okv.Value, &rec)
	if herr == nil {
		stored, herr = hex.DecodeString(rec.SHA256)
	}
	// Compare even when the record is unusable, so that every refusal
	// costs the same.
	if len(stored) != sha256.Size {
		stored = make([]byte, sha256.Size)
	}
	match := subtle.ConstantTimeCompare(presented[:], stored) == 1
	switch {
	case herr != nil || okv.Lease != kv.Lease || rec.Ref != ref.String():
		return notFound(ref)
	case !match || secret == "":
		return errWrongSecret{notFound(ref)}
	}
	return nil
}

// Heartbeat keeps alive the lease of the registration at ref, whose secret
// the caller presents, and returns the lease's TTL. A wrong secret, an
// unknown instance or an ended lease give notFound — except to a caller
// the store does not allow to renew the lease (etcd asks for write
// permission on its keys), who gets permissionDenied whatever the secret
// (refuse).
//
// Its store calls are bounded as a session's keep-alives are (a sixth of
// the lease's TTL, at most 2 s; the reads, local to the member that
// answers them, half that) and one that timed out is tried again at once,
// while ctx allows: a call that reached a hung store server (an etcd
// member that accepts connections and answers nothing) costs one attempt,
// and the next goes to another member (the etcd store soon leaves the
// silent one out), instead of the whole heartbeat waiting for the store's
// request timeout while the lease runs out.
//
// The first heartbeat of a registration through this registry proves
// ownership against the store (prove); later ones with the same secret
// need only find the instance still bound to its lease, and read it while
// the keep-alive goes out (renewProven): one round trip, not three in a
// row, so that fewer of a heartbeat's calls can meet a hung member, and
// none waits for another.
func (r *StoreRegistry) Heartbeat(ctx context.Context, ref beacon.Ref, secret Secret) (time.Duration, error) {
	if err := r.refuseWrite("heartbeat"); err != nil {
		return 0, err
	}
	if err := r.checkRef(ref); err != nil {
		return 0, err
	}
	if r.closed.Load() {
		return 0, ErrClosed
	}
	limit := keepAliveTimeout(r.leased.ttl(ref))
	h := secret.hash()
	if lease, ok := r.leased.proven(ref, h); ok {
		if ttl, settled, err := r.renewProven(ctx, ref, lease, limit); settled {
			return ttl, err
		}
	}
	kv, err := r.prove(ctx, ref, secret, limit)
	if err != nil {
		return 0, err
	}
	ttl, err := retryTimedOut(ctx, r.st, limit, func(ctx context.Context) (time.Duration, error) {
		return r.st.KeepAlive(ctx, kv.Lease)
	})
	if err != nil {
		return 0, r.ownedWriteError("heartbeat", ref, kv.Lease, err)
	}
	r.leased.heartbeat(kv.Lease, ref, ttl)
	r.leased.prove(kv.Lease, ref, h)
	return ttl, nil
}

// prove reads the registration at ref and checks that secret is its
// owner's, returning it as stored, with Heartbeat's bounds (limit).
//
// The reads are local where the store can (a serializable read:
// store.LocalReader), so that a heartbeat waits for no round trip through
// the cluster's leader but the keep-alive's own: with the leader's disk
// slow, linearizable reads took over a second on every member and the
// heartbeats of a 3 s lease timed out until it expired. A stale read is
// safe here: an ownership record never changes while its lease lives, a
// proof against a record already gone only renews a lease that has ended
// (notFound), and a proof that fails is checked again with linearizable
// reads before it is refused.
func (r *StoreRegistry) prove(ctx context.Context, ref beacon.Ref, secret Secret, limit time.Duration) (store.KeyValue, error) {
	var kv store.KeyValue
	check := func(read func(context.Context, string) (store.KeyValue, error)) (err error) {
		kv, err = retryTimedOut(ctx, r.st, limit/2, func(ctx context.Context) (store.KeyValue, error) {
			_, kv, err := r.getWith(ctx, ref, read)
			if err != nil {
				return kv, err
			}
			return kv, r.ownsWith(ctx, ref, kv, secret, read)
		})
		return err
	}
	err := errNoLocalRead
	if lr, ok := r.st.(store.LocalReader); ok {
		err = check(lr.GetLocal)
	}
	if errors.Is(err, beacon.ErrNotFound) || errors.Is(err, errNoLocalRead) {
		err = check(r.st.Get)
	}
	if _, wrong := errors.AsType[errWrongSecret](err); wrong {
		// etcd checks the caller's write permission on the lease's keys
		// to renew it: answer as the right secret would be answered.
		refused, _ := retryTimedOut(ctx, r.st, limit, func(ctx context.Context) (error, error) {
			refused := r.refuse(ctx, "heartbeat", ref, kv, err)
			return refused, refused
		})
		return kv, refused
	}
	return kv, err
}

// renewProven is the heartbeat of a registration whose owner's secret was
// proven before (leasedTracker.proven): it renews lease while it reads the
// instance (locally where the store can) and checks that the instance is
// still bound to lease. Renewing first is safe: the lease is the proven
// owner's. It is settled unless the instance was not found bound to lease
// (deleted, registered again, or a stale local read), which Heartbeat's
// proof then decides from the store.
func (r *StoreRegistry) renewProven(ctx context.Context, ref beacon.Ref, lease store.LeaseID, limit time.Duration) (ttl time.Duration, settled bool, err error) {
	read := r.st.Get
	if lr, ok := r.st.(store.LocalReader); ok {
		read = lr.GetLocal
	}
	var kv store.KeyValue
	var rerr error
	done := make(chan struct{})
	go func() { // owned by renewProven, which waits for it
		defer close(done)
		kv, rerr = retryTimedOut(ctx, r.st, limit/2, func(ctx context.Context) (store.KeyValue, error) {
			_, kv, err := r.getWith(ctx, ref, read)
			return kv, err
		})
	}()
	ttl, err = retryTimedOut(ctx, r.st, limit, func(ctx context.Context) (time.Duration, error) {
		return r.st.KeepAlive(ctx, lease)
	})
	<-done
	switch {
	case err != nil:
		return 0, true, r.ownedWriteError("heartbeat", ref, lease, err)
	case rerr == nil && kv.Lease == lease:
		r.leased.heartbeat(lease, ref, ttl)
		return ttl, true, nil
	case rerr != nil && !errors.Is(rerr, beacon.ErrNotFound):
		return 0, true, rerr
	}
	return 0, false, nil
}

// ownedWriteError is the error of op, a write on the owned registration at
// ref under lease, that the store refused with err: a lease that ended is
// forgotten and gives not found, a caller the store does not allow the
// write gets permissionDenied.
func (r *StoreRegistry) ownedWriteError(op string, ref beacon.Ref, lease store.LeaseID, err error) error {
	switch {
	case errors.Is(err, store.ErrLeaseNotFound):
		r.leased.ended(lease)
		return notFound(ref)
	case errors.Is(err, store.ErrPermissionDenied):
		return permissionDenied(op, ref)
	}
	return fmt.Errorf("registry: %s %s: %w", op, ref, err)
}

// errNoLocalRead stands for a proof of ownership not read locally yet.
var errNoLocalRead = errors.New("registry: not read locally")

// UpdateLeased changes the registration at ref, whose secret the caller
// presents, with compare-and-swap: mutate receives the stored instance and
// may change Address, Transport, Metadata and Status (not its identity).
// Concurrent writes are retried. It returns the instance as written.
//
// The change is validated before the secret is checked, and a caller the
// store would not allow the change gets the same error whatever the
// secret (refuse): no answer tells a right secret from a wrong one unless
// the secret is right and the change allowed.
func (r *StoreRegistry) UpdateLeased(ctx context.Context, ref beacon.Ref, secret Secret, mutate func(*beacon.Instance)) (beacon.Instance, error) {
	if err := r.refuseWrite("update an instance"); err != nil {
		return beacon.Instance{}, err
	}
	for range 16 {
		cur, kv, err := r.get(ctx, ref)
		if err != nil {
			return beacon.Instance{}, err
		}
		next := cur.Clone()
		mutate(&next)
		if next.Ref() != cur.Ref() || !next.RegisteredAt.Equal(cur.RegisteredAt) {
			return beacon.Instance{}, fmt.Errorf("%w (%s)", ErrIdentityChanged, ref)
		}
		if next.Status == "" {
			next.Status = beacon.StatusServing
		}
		next.Health = nil // the checkers' verdict: never advertised by a registrant
		if err := next.ValidateWith(r.cfg.MaxMetadataSize); err != nil {
			return beacon.Instance{}, err
		}
		if err := r.owns(ctx, ref, kv, secret); err != nil {
			return beacon.Instance{}, r.refuse(ctx, "update", ref, kv, err)
		}
		val, err := encode(next, storedTTL(kv.Value))
		if err != nil {
			return beacon.Instance{}, err
		}
		_, err = r.st.Update(ctx, kv.Key, val, kv.ModRevision, store.WithLease(kv.Lease))
		switch {
		case err == nil:
			return next, nil
		case errors.Is(err, store.ErrConflict):
			continue
		case errors.Is(err, store.ErrNotFound):
			r.leased.deregistered(kv.Lease, ref) // deleted under us
			return beacon.Instance{}, notFound(ref)
		}
		return beacon.Instance{}, r.ownedWriteError("update", ref, kv.Lease, err)
	}
	return beacon.Instance{}, fmt.Errorf("registry: update %s: %w (too many concurrent writers)", ref, store.ErrConflict)
}

// DeregisterLeased ends the registration at ref, whose secret the caller
// presents, by revoking its own lease: the instance and its ownership
// record go in one revision. Nothing else is bound to that lease. A caller
// the store would not allow it gets the same error whatever the secret
// (refuse).
func (r *StoreRegistry) DeregisterLeased(ctx context.Context, ref beacon.Ref, secret Secret) error {
	_, kv, err := r.getOwned(ctx, ref, secret, "deregister an instance", "deregister")
	if err != nil {
		return err
	}
	if err := r.st.Revoke(ctx, kv.Lease); err != nil {
		return r.ownedWriteError("deregister", ref, kv.Lease, err)
	}
	r.leased.ended(kv.Lease)
	return nil
}
