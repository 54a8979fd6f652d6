package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/beaconplane/beacon/store"
)

func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		key  string
		ok   bool
		says string // part of the error
	}{
		{"/services/prod/api/http/00000000000000a1", true, ""},
		{"k", true, ""},
		{"ключ/键", true, ""},
		{strings.Repeat("k", store.MaxKeySize), true, ""},
		{"", false, "empty key"},
		{strings.Repeat("k", store.MaxKeySize+1), false, "longer than the 1024-byte limit"},
		{"bad\xff", false, "not valid UTF-8"},
	} {
		err := store.ValidateKey(tc.key)
		if tc.ok {
			if err != nil {
				t.Errorf("ValidateKey(%.20q): %v", tc.key, err)
			}
			continue
		}
		if !errors.Is(err, store.ErrInvalidKey) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("ValidateKey(%.20q) = %v, want ErrInvalidKey saying %q", tc.key, err, tc.says)
		}
	}
	if err := store.ValidatePrefix(""); err != nil {
		t.Errorf("ValidatePrefix(\"\") (the whole store): %v", err)
	}
	if err := store.ValidatePrefix("\xff"); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("ValidatePrefix of a non-UTF-8 prefix: %v", err)
	}
}

func TestValidateValueAndTTL(t *testing.T) {
	if err := store.ValidateValue(make([]byte, store.MaxValueSize)); err != nil {
		t.Errorf("a value of exactly the limit: %v", err)
	}
	err := store.ValidateValue(make([]byte, store.MaxValueSize+1))
	if !errors.Is(err, store.ErrValueTooLarge) || !strings.Contains(err.Error(), "524289 bytes is more than the 524288-byte limit") {
		t.Errorf("a value over the limit: %v", err)
	}
	for _, ttl := range []time.Duration{store.MinLeaseTTL, 10 * time.Second, store.MaxLeaseTTL} {
		if err := store.ValidateTTL(ttl); err != nil {
			t.Errorf("ValidateTTL(%v): %v", ttl, err)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second, store.MinLeaseTTL - 1, store.MaxLeaseTTL + 1} {
		err := store.ValidateTTL(ttl)
		if !errors.Is(err, store.ErrInvalidTTL) || !strings.Contains(err.Error(), "outside [1s, 24h0m0s]") {
			t.Errorf("ValidateTTL(%v) = %v", ttl, err)
		}
	}
}

func TestValidateOps(t *testing.T) {
	put := func(k string) store.Op { return store.Op{Kind: store.OpPut, Key: k, Value: []byte("v")} }
	if err := store.ValidateOps([]store.Op{put("/a"), {Kind: store.OpDelete, Key: "/b"}}); err != nil {
		t.Errorf("valid transaction: %v", err)
	}
	for name, tc := range map[string]struct {
		ops  []store.Op
		is   error
		says string
	}{
		"empty":      {nil, nil, "empty transaction"},
		"bad key":    {[]store.Op{put("")}, store.ErrInvalidKey, "empty key"},
		"too large":  {[]store.Op{{Kind: store.OpPut, Key: "/a", Value: make([]byte, store.MaxValueSize+1)}}, store.ErrValueTooLarge, "limit"},
		"no kind":    {[]store.Op{{Key: "/a"}}, nil, `op on "/a" has unknown kind 0`},
		"twice":      {[]store.Op{put("/a"), put("/a")}, store.ErrInvalidKey, `key "/a" appears twice`},
		"delete+put": {[]store.Op{{Kind: store.OpDelete, Key: "/a"}, put("/a")}, store.ErrInvalidKey, "twice"},
	} {
		err := store.ValidateOps(tc.ops)
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: ValidateOps = %v, want %v saying %q", name, err, tc.is, tc.says)
		}
	}
}

func TestErrors(t *testing.T) {
	ce := error(&store.CompactedError{Requested: 3, CompactRevision: 10})
	if !errors.Is(ce, store.ErrCompacted) || !strings.Contains(ce.Error(), "re-list") {
		t.Errorf("CompactedError: %v", ce)
	}
	for _, sentinel := range []error{store.ErrConflict, store.ErrKeyExists, store.ErrNotFound} {
		err := error(&store.ConflictError{Key: "/k", Err: sentinel})
		if !errors.Is(err, store.ErrConflict) || !errors.Is(err, sentinel) || !strings.Contains(err.Error(), `"/k"`) {
			t.Errorf("ConflictError of %v: %v", sentinel, err)
		}
	}
	if errors.Is(&store.ConflictError{Key: "/k", Err: store.ErrKeyExists}, store.ErrNotFound) {
		t.Error("a ConflictError matches a sentinel it does not wrap")
	}
}

func TestOptions(t *testing.T) {
	if o := store.ApplyWriteOptions(nil); o.Lease != store.NoLease {
		t.Errorf("default write options: %+v", o)
	}
	if o := store.ApplyWriteOptions([]store.WriteOption{store.WithLease(7)}); o.Lease != 7 {
		t.Errorf("WithLease(7): %+v", o)
	}
	if o := store.ApplyDeleteOptions([]store.DeleteOption{store.IfModRevision(9)}); o.IfModRevision != 9 {
		t.Errorf("IfModRevision(9): %+v", o)
	}
	if store.EventPut.String() != "PUT" || store.EventDelete.String() != "DELETE" || store.EventType(0).String() != "UNKNOWN" {
		t.Error("EventType.String")
	}
}

// FuzzValidateKey: a key is accepted exactly when it is 1 to MaxKeySize
// bytes of UTF-8, and a refusal is always ErrInvalidKey.
func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"", "/", "/services/a/b/c/0000000000000000", "\xff", "a\x00b", strings.Repeat("é", 600)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := store.ValidateKey(key)
		want := key != "" && len(key) <= store.MaxKeySize && utf8.ValidString(key)
		if (err == nil) != want {
			t.Fatalf("ValidateKey(%q) = %v, want ok=%v", key, err, want)
		}
		if err != nil && !errors.Is(err, store.ErrInvalidKey) {
			t.Fatalf("ValidateKey(%q) = %v, not ErrInvalidKey", key, err)
		}
		if perr := store.ValidatePrefix(key); (perr == nil) != (want || key == "") {
			t.Fatalf("ValidatePrefix(%q) = %v", key, perr)
		}
	})
}

// FuzzValidateTTL: a TTL is accepted exactly inside [MinLeaseTTL,
// MaxLeaseTTL].
func FuzzValidateTTL(f *testing.F) {
	for _, d := range []int64{0, -1, int64(time.Second), int64(24 * time.Hour), int64(24*time.Hour) + 1, 1<<63 - 1} {
		f.Add(d)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		ttl := time.Duration(n)
		err := store.ValidateTTL(ttl)
		if want := ttl >= store.MinLeaseTTL && ttl <= store.MaxLeaseTTL; (err == nil) != want {
			t.Fatalf("ValidateTTL(%v) = %v", ttl, err)
		}
		if err != nil && !errors.Is(err, store.ErrInvalidTTL) {
			t.Fatalf("ValidateTTL(%v) = %v, not ErrInvalidTTL", ttl, err)
		}
	})
}

// FuzzValidateOps: an accepted transaction has known kinds, valid keys and
// values, and no key twice.
func FuzzValidateOps(f *testing.F) {
	f.Add("/a", "/b", uint8(1), uint8(2), 3)
	f.Add("/a", "/a", uint8(1), uint8(1), 0)
	f.Add("", "\xff", uint8(0), uint8(9), -1)
	f.Fuzz(func(t *testing.T, k1, k2 string, kind1, kind2 uint8, size int) {
		size = min(max(size, 0), store.MaxValueSize+1)
		ops := []store.Op{
			{Kind: store.OpKind(kind1), Key: k1, Value: make([]byte, size)},
			{Kind: store.OpKind(kind2), Key: k2},
		}
		err := store.ValidateOps(ops)
		valid := func(o store.Op) bool {
			return (o.Kind == store.OpPut || o.Kind == store.OpDelete) && store.ValidateWrite(o.Key, o.Value) == nil
		}
		if want := valid(ops[0]) && valid(ops[1]) && k1 != k2; (err == nil) != want {
			t.Fatalf("ValidateOps(%q %d, %q %d, %d bytes) = %v, want ok=%v", k1, kind1, k2, kind2, size, err, want)
		}
	})
}
