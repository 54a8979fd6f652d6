package publish

import (
	"slices"
	"testing"
)

type val struct {
	addr  string
	serve bool
}

func keysOf(es []Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Key + "=" + e.Addr
	}
	return out
}

func TestView(t *testing.T) {
	builds := 0
	v := NewView(func(a, b val) bool { return a == b }, func(_ string, x val) (Entry, bool) {
		builds++
		return Entry{Addr: x.addr}, x.serve
	})
	check := func(want []string, wantUndialable int) {
		t.Helper()
		es, und := v.Entries()
		if got := keysOf(es); !slices.Equal(got, want) || und != wantUndialable {
			t.Errorf("entries %v (%d undialable); want %v (%d)", got, und, want, wantUndialable)
		}
	}
	// A snapshot, unsorted, sorted once.
	v.Reset()
	v.Set("c", val{"h:3", true})
	v.Set("a", val{"h:1", true})
	v.Set("b", val{"nats://x", true})
	v.Set("d", val{"h:4", false}) // kept, not included
	check([]string{"a=h:1", "b=nats://x", "c=h:3"}, 1)
	if v.Len() != 4 {
		t.Errorf("Len = %d", v.Len())
	}
	if n := v.Count(func(x val) bool { return !x.serve }); n != 1 {
		t.Errorf("Count(not served) = %d, want 1", n)
	}
	// Incremental changes keep the order; an equal Set builds nothing.
	n := builds
	v.Set("a", val{"h:1", true})
	if builds != n {
		t.Error("an equal Set rebuilt the entry")
	}
	v.Set("bb", val{"h:2", true})
	v.Set("d", val{"h:4", true})
	v.Delete("b")
	v.Delete("zz")
	check([]string{"a=h:1", "bb=h:2", "c=h:3", "d=h:4"}, 0)
	// Delete during a snapshot.
	v.Reset()
	v.Set("y", val{"h:9", true})
	v.Set("x", val{"h:8", true})
	v.Delete("y")
	check([]string{"x=h:8"}, 0)
}

func TestDialable(t *testing.T) {
	for addr, want := range map[string]bool{
		"h:1": true, "10.0.0.1:50051": true, "[::1]:443": true,
		"h": false, ":80": false, "h:0": false, "h:65536": false, "h:x": false, "nats://h:4222": false, "": false,
	} {
		if got := Dialable(addr); got != want {
			t.Errorf("Dialable(%q) = %v", addr, got)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 10, Max: 80}
	var got []int64
	for range 6 {
		got = append(got, int64(b.Next()))
	}
	// Each delay is within 20% below the doubling sequence, capped.
	for i, want := range []int64{10, 20, 40, 80, 80, 80} {
		if got[i] > want || got[i] < want*8/10 {
			t.Errorf("delay %d = %d, want about %d", i, got[i], want)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10 {
		t.Errorf("after Reset: %d", d)
	}
}
