package bootstrap

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestRegistryOrdersByCreateRevisionAndTakesFirstN(t *testing.T) {
	const tok = "t"
	r := newRegistry(tok)
	r.setSize([]byte("2"), true)
	mp := MembersPrefix(tok) + "/"
	r.put(mp+"c", "c=http://c:1", 9)
	if r.full() {
		t.Fatal("full with 1 member of 2")
	}
	r.put(mp+"a", "a=http://a:1", 5)
	r.put(mp+"b", "b=http://b:1", 7)
	r.put(mp+"bad", "no-equals-sign", 6)
	r.put(MembersPrefix(tok)+"X", "x=http://x:1", 11) // etcd's prefix quirk: counted
	r.put(mp+"a", "a=http://a:1", 5)                  // re-registration keeps its place

	st := r.status()
	if st.State != StateFull || st.Registered() != 2 {
		t.Fatalf("state %s, registered %d", st.State, st.Registered())
	}
	var order []string
	for _, m := range st.Members {
		order = append(order, m.Name)
	}
	if got := strings.Join(order, ","); got != "a,b,c,x" {
		t.Fatalf("order %s", got)
	}
	if len(st.Skipped) != 1 || st.Skipped[0].Reason != "invalid peer info returned from discovery service" {
		t.Fatalf("skipped %+v", st.Skipped)
	}
	ic, err := st.InitialCluster()
	if err != nil || ic != "a=http://a:1,b=http://b:1" {
		t.Fatalf("initial cluster %q, %v", ic, err)
	}
	if late := st.Late(); len(late) != 2 || late[0].Name != "c" {
		t.Fatalf("late %+v", late)
	}

	r.remove(mp + "a")
	if st := r.status(); st.In()[0].Name != "b" || st.In()[1].Name != "c" {
		t.Fatalf("after delete: %+v", st.In())
	}
}

func TestInitialClusterChecks(t *testing.T) {
	mk := func(vals ...string) Status {
		r := newRegistry("t")
		r.setSize([]byte("2"), true)
		for i, v := range vals {
			r.put(MembersPrefix("t")+"/"+string(rune('a'+i)), v, int64(i+1))
		}
		return r.status()
	}
	for _, tc := range []struct {
		vals []string
		want error
	}{
		{[]string{"a=http://a:1", "b=ftp://b:1"}, ErrInvalidURL},
		{[]string{"a=http://a:1", "a=http://b:1"}, ErrDuplicateName},
		{[]string{"a=http://a:1", "b=http://a:1"}, ErrDuplicateURL},
	} {
		if _, err := mk(tc.vals...).InitialCluster(); !errors.Is(err, tc.want) {
			t.Errorf("%q: %v, want %v", tc.vals, err, tc.want)
		}
	}
	if _, err := mk("a=http://a:1").InitialCluster(); err == nil {
		t.Error("initial cluster of a waiting token")
	}
}

func TestSizeErrors(t *testing.T) {
	r := newRegistry("t")
	r.setSize(nil, false)
	if !errors.Is(r.sizeErr, ErrSizeNotFound) || !strings.Contains(r.sizeErr.Error(), "discovery: size key not found") {
		t.Fatalf("missing size: %v", r.sizeErr)
	}
	r.setSize([]byte("0"), true)
	if !errors.Is(r.sizeErr, ErrBadSizeKey) || r.full() {
		t.Fatalf("bad size: %v", r.sizeErr)
	}
}

// TestLongValuesAreShortenedInErrors: a registration with a 1 MiB name,
// written into the registry by hand, was echoed in full in the error of a
// clash (and so in the 409 of GET /v1/tokens/{token}, the list's problem
// and beacon token status). Long values are now cut, saying their length.
func TestLongValuesAreShortenedInErrors(t *testing.T) {
	big := strings.Repeat("n", 1<<20)
	mk := func(vals ...string) Status {
		r := newRegistry("t")
		r.setSize([]byte("2"), true)
		for i, v := range vals {
			r.put(MembersPrefix("t")+"/"+string(rune('a'+i)), v, int64(i+1))
		}
		return r.status()
	}
	for _, tc := range []struct {
		vals []string
		want error
	}{
		{[]string{big + "=http://a:1", big + "=http://b:1"}, ErrDuplicateName},
		{[]string{big + "=http://a:1", "b=http://a:1"}, ErrDuplicateURL},
		{[]string{big + "=http://a:1", "b=ftp://" + big + ":1"}, ErrInvalidURL},
	} {
		_, err := mk(tc.vals...).InitialCluster()
		if !errors.Is(err, tc.want) || len(err.Error()) > 1000 || !strings.Contains(err.Error(), "bytes)") {
			t.Errorf("%v: message of %d bytes: %.300s", tc.want, len(err.Error()), err)
		}
	}
	r := newRegistry("t")
	r.setSize([]byte("3"), true)
	r.put(MembersPrefix("t")+"/a", big+"=http://a:1", 1)
	r.put(MembersPrefix("t")+"/c", "x=http://c:1,x=http://"+big+":1", 2)
	for _, err := range []error{r.conflict(MembersPrefix("t")+"/b", "x", []string{"http://b:1"}),
		r.conflict(MembersPrefix("t")+"/b", "x", []string{"http://a:1"})} {
		if err == nil || len(err.Error()) > 1000 {
			t.Errorf("conflict message of %d bytes: %.300v", len(fmt.Sprint(err)), err)
		}
	}
}
