package mvcc

import (
	"bytes"
	"fmt"

	"github.com/beaconplane/beacon/store"
)

type changeKind uint8

const (
	kindCreate changeKind = iota + 1
	kindPut
	kindUpdate
	kindDelete
	kindTxn
	kindEndLease
)

// Change is one write of the store contract: a Create, Put, Update or
// Delete of one key, a transaction, or the end of a lease. Its arguments are
// validated when it is made (Err); a Store checks it against the current
// state and turns it into the events of one revision.
type Change struct {
	kind  changeKind
	err   error
	key   string
	value []byte
	opts  store.WriteOptions
	rev   int64 // Update: the expected ModRevision; Delete: IfModRevision (0: any)
	ops   []store.Op
	lease store.LeaseID // EndLease
}

// Create writes key only if it is absent (store.Writer.Create).
func Create(key string, value []byte, opts []store.WriteOption) Change {
	return write(kindCreate, key, value, 0, opts)
}

// Put writes key whether or not it exists (store.Writer.Put).
func Put(key string, value []byte, opts []store.WriteOption) Change {
	return write(kindPut, key, value, 0, opts)
}

// Update writes key only if its ModRevision is modRevision
// (store.Writer.Update).
func Update(key string, value []byte, modRevision int64, opts []store.WriteOption) Change {
	return write(kindUpdate, key, value, modRevision, opts)
}

func write(kind changeKind, key string, value []byte, rev int64, opts []store.WriteOption) Change {
	return Change{kind: kind, err: store.ValidateWrite(key, value), key: key, value: value, rev: rev,
		opts: store.ApplyWriteOptions(opts)}
}

// Delete removes key (store.Writer.Delete).
func Delete(key string, opts []store.DeleteOption) Change {
	return Change{kind: kindDelete, err: store.ValidateKey(key), key: key,
		rev: store.ApplyDeleteOptions(opts).IfModRevision}
}

// Txn applies ops at one revision, all or nothing (store.Transactor.Txn).
// Deleting an absent key does nothing; a transaction that changes nothing
// takes no revision.
func Txn(ops []store.Op) Change {
	return Change{kind: kindTxn, err: store.ValidateOps(ops), ops: ops}
}

// EndLease deletes every key bound to the lease, in one revision (none if
// it has no keys). Ending the lease itself is the backend's business.
func EndLease(id store.LeaseID) Change {
	return Change{kind: kindEndLease, lease: id}
}

// Err reports invalid arguments (store.ErrInvalidKey, ErrValueTooLarge,
// ...): such a change must be refused before anything else is looked at.
func (c Change) Err() error { return c.err }

// Key is the key of a single-key change.
func (c Change) Key() string { return c.key }

// Value is the value of a Create, Put or Update, as the caller passed it.
func (c Change) Value() []byte { return c.value }

// Check checks the precondition of a single-key change (Create, Put,
// Update, Delete) against the key's current value, nil if the key is
// absent. It returns the lease the written key is to be bound to (the
// key's own with store.KeepLease; NoLease for a Delete); whether that lease
// is alive is the caller's to check.
func (c Change) Check(old *store.KeyValue) (store.LeaseID, error) {
	switch c.kind {
	case kindCreate:
		if old != nil {
			return 0, fmt.Errorf("%w: %q (created at revision %d)", store.ErrKeyExists, c.key, old.CreateRevision)
		}
	case kindUpdate:
		if err := checkModRevision(c.key, old, c.rev); err != nil {
			return 0, err
		}
	case kindDelete:
		if old == nil {
			return 0, fmt.Errorf("%w: %q", store.ErrNotFound, c.key)
		}
		if c.rev != 0 {
			return 0, checkModRevision(c.key, old, c.rev)
		}
		return store.NoLease, nil
	case kindPut:
	default:
		return 0, fmt.Errorf("mvcc: Check of a change that is not a single-key write (kind %d)", c.kind)
	}
	if !c.opts.KeepLease {
		return c.opts.Lease, nil
	}
	if old == nil {
		return 0, fmt.Errorf("%w: %q (keeping its lease needs the key)", store.ErrNotFound, c.key)
	}
	return old.Lease, nil
}

func checkModRevision(key string, old *store.KeyValue, want int64) error {
	if old == nil {
		return fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	if old.ModRevision != want {
		return fmt.Errorf("%w: %q was written at revision %d, not %d", store.ErrConflict, key, old.ModRevision, want)
	}
	return nil
}

// CheckOp checks the preconditions of one transaction op against the key's
// current value (nil if absent): a *store.ConflictError naming the key, or
// nil.
func CheckOp(op store.Op, old *store.KeyValue) error {
	switch {
	case op.IfAbsent && old != nil:
		return &store.ConflictError{Key: op.Key, Err: store.ErrKeyExists}
	case op.IfModRevision != 0 && old == nil:
		return &store.ConflictError{Key: op.Key, Err: store.ErrNotFound}
	case op.IfModRevision != 0 && old.ModRevision != op.IfModRevision:
		return &store.ConflictError{Key: op.Key, Err: store.ErrConflict}
	}
	return nil
}

// txn turns one Change into the events of revision rev, reading the state
// before it. It runs under the Store's lock.
type txn struct {
	s      *Store
	rev    int64
	events []store.Event
}

func (t *txn) build(c Change) error {
	switch c.kind {
	case kindTxn:
		return t.ops(c.ops)
	case kindEndLease:
		t.endLease(c.lease)
		return nil
	}
	old := t.s.get(c.key)
	lease, err := c.Check(old)
	if err != nil {
		return err
	}
	if c.kind == kindDelete {
		t.delete(c.key)
		return nil
	}
	if err := t.s.checkLease(lease); err != nil {
		return err
	}
	t.put(c.key, c.value, lease, old)
	return nil
}

// ops checks every op in order, the first failure refusing the whole
// transaction, and makes the events of those that change something.
func (t *txn) ops(ops []store.Op) error {
	for _, op := range ops {
		old := t.s.get(op.Key)
		if err := CheckOp(op, old); err != nil {
			return err
		}
		switch {
		case op.Kind == store.OpPut:
			if err := t.s.checkLease(op.Lease); err != nil {
				return fmt.Errorf("%w (for %q)", err, op.Key)
			}
			t.put(op.Key, op.Value, op.Lease, old)
		case old != nil:
			t.delete(op.Key)
		}
	}
	return nil
}

// put makes the event of writing key; the value is copied, so the caller
// may reuse its slice.
func (t *txn) put(key string, value []byte, lease store.LeaseID, old *store.KeyValue) {
	kv := store.KeyValue{Key: key, Value: bytes.Clone(value), CreateRevision: t.rev, ModRevision: t.rev, Lease: lease}
	if kv.Value == nil {
		kv.Value = []byte{}
	}
	if old != nil {
		kv.CreateRevision = old.CreateRevision
	}
	t.events = append(t.events, store.Event{Type: store.EventPut, KV: kv})
}

func (t *txn) delete(key string) {
	t.events = append(t.events, store.Event{Type: store.EventDelete, KV: store.KeyValue{Key: key, ModRevision: t.rev}})
}

// endLease deletes the lease's keys in key order.
func (t *txn) endLease(id store.LeaseID) {
	for _, key := range t.s.leaseKeys(id) {
		t.delete(key)
	}
}
