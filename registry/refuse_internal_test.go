package registry

import (
	"fmt"
	"testing"
	"time"
)

// TestPermCache: the store's answer for a namespace is kept for
// permCacheFor, then asked again; the cache stays bounded.
func TestPermCache(t *testing.T) {
	var c permCache
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, known := c.get("a", t0); known {
		t.Fatal("an empty cache knows an answer")
	}
	c.put("a", true, t0)
	c.put("b", false, t0)
	for _, x := range []struct {
		ns            string
		at            time.Duration
		denied, known bool
	}{
		{"a", 0, true, true},
		{"b", 0, false, true},
		{"a", permCacheFor - time.Nanosecond, true, true},
		{"a", permCacheFor, false, false},
		{"c", 0, false, false},
	} {
		denied, known := c.get(x.ns, t0.Add(x.at))
		if denied != x.denied || known != x.known {
			t.Errorf("get(%s, +%v) = %v, %v; want %v, %v", x.ns, x.at, denied, known, x.denied, x.known)
		}
	}
	for i := range 3 * permCacheMax {
		c.put(fmt.Sprint("ns", i), false, t0)
	}
	if n := len(c.m); n > permCacheMax {
		t.Fatalf("cache holds %d namespaces, bound %d", n, permCacheMax)
	}
}
