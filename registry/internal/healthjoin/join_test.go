package healthjoin

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
)

func TestInPanic(t *testing.T) {
	for _, c := range []struct {
		checked, failing int
		threshold        float64
		want             bool
	}{
		{3, 2, 0.5, true},
		{2, 1, 0.5, false}, // exactly the threshold: not more
		{1, 1, 0.5, true},
		{4, 0, 0.5, false},
		{0, 0, 0.5, false}, // no checked instance: no panic
		{0, 0, 0, false},
		{5, 5, 1, false}, // 1: never more than every instance
		{5, 1, 0.1, true},
		{5, 5, -1, false}, // off
		{5, 5, -0.0001, false},
		{10, 1, 0.1, false},
		{10, 2, 0.1, true},
	} {
		if got := InPanic(c.checked, c.failing, c.threshold); got != c.want {
			t.Errorf("InPanic(checked %d, failing %d, threshold %v) = %v, want %v", c.checked, c.failing, c.threshold, got, c.want)
		}
	}
}

// joinRig drives a healthJoin as a feed does: instances by ID in one
// service (and "other/..." in another), joined, counted and settled.
type joinRig struct {
	t     *testing.T
	j     *Join
	insts map[string]beacon.Instance // key → instance as joined
}

func newJoinRig(t *testing.T, threshold float64) *joinRig {
	return &joinRig{t: t, j: New(threshold), insts: make(map[string]beacon.Instance)}
}

func joinKey(id string) string {
	ep := "e"
	if rest, ok := strings.CutPrefix(id, "other/"); ok {
		ep, id = "other", rest
	}
	return "/services/ns/c/" + ep + "/" + id
}

// put writes the instance id, declaring a check or not, at the default
// priority.
func (g *joinRig) put(id string, checked bool) { g.putAt(id, checked, "", "") }

// putAt writes the instance id, declaring a check or not, with metadata
// priority=prio ("": none) and status.
func (g *joinRig) putAt(id string, checked bool, prio string, status beacon.Status) {
	key := joinKey(id)
	parts := strings.Split(key, "/")
	in := beacon.Instance{Namespace: "ns", Component: "c", Endpoint: parts[4], ID: parts[5], Status: status}
	if prio != "" {
		in.Metadata = map[string]string{beacon.MetaPriority: prio}
	}
	if checked {
		in.Check = &beacon.Check{Kind: beacon.CheckTCP}
	}
	in.Health = g.j.Health(key, in)
	old, had := g.insts[key]
	g.insts[key] = in
	if had {
		g.j.Count(key, &old, &in)
	} else {
		g.j.Count(key, nil, &in)
	}
}

func (g *joinRig) remove(id string) {
	key := joinKey(id)
	old := g.insts[key]
	delete(g.insts, key)
	g.j.Count(key, &old, nil)
}

func (g *joinRig) verdict(id string, s beacon.HealthStatus) {
	if g.j.SetVerdict(joinKey(id), beacon.Health{Status: s, Panic: true}) { // Panic is never taken from the store
		g.rejoin(joinKey(id))
	}
}

func (g *joinRig) unverdict(id string) {
	if g.j.DeleteVerdict(joinKey(id)) {
		g.rejoin(joinKey(id))
	}
}

func (g *joinRig) rejoin(key string) {
	old, ok := g.insts[key]
	if !ok {
		return
	}
	in := old
	in.Health = g.j.Health(key, old)
	g.insts[key] = in
	g.j.Count(key, &old, &in)
}

// settle returns the changes as "enter|leave service failing/checked
// keys", the service followed by "@" and the priority unless it is the
// default one.
func (g *joinRig) settle() []string {
	var out []string
	for _, c := range g.j.Settle() {
		verb := "leave"
		if c.Enter {
			verb = "enter"
		}
		for _, key := range c.Keys {
			g.rejoin(key)
		}
		level := c.Service
		if c.Priority != beacon.DefaultPriority {
			level += fmt.Sprintf("@%d", c.Priority)
		}
		out = append(out, fmt.Sprintf("%s %s %d/%d %d", verb, level, c.Failing, c.Checked, len(c.Keys)))
	}
	return out
}

// health describes every instance's health: "id:status" with "!" for
// Panic and "-" for none, in key order.
func (g *joinRig) health() string {
	var out []string
	for _, key := range slices.Sorted(func(yield func(string) bool) {
		for k := range g.insts {
			if !yield(k) {
				return
			}
		}
	}) {
		in := g.insts[key]
		s := in.ID + ":-"
		if in.Health != nil {
			s = in.ID + ":" + string(in.Health.Status)
			if in.Health.Panic {
				s += "!"
			}
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// Each transition of a service's panic, as the feed drives the join: a
// batch of changes, then settle.
func TestHealthJoinPanicTransitions(t *testing.T) {
	const (
		pass = beacon.HealthPassing
		fail = beacon.HealthFailing
	)
	type step struct {
		do      func(g *joinRig)
		changes []string // what settle reports
		health  string   // every instance afterwards
	}
	three := func(g *joinRig) {
		g.put("a", true)
		g.put("b", true)
		g.put("c", true)
	}
	for _, tc := range []struct {
		name      string
		threshold float64
		steps     []step
	}{
		{"enter", 0.5, []step{
			{three, nil, "a:unknown b:unknown c:unknown"},
			{func(g *joinRig) { g.verdict("a", fail) }, nil, "a:failing b:unknown c:unknown"},
			{func(g *joinRig) { g.verdict("b", fail) }, []string{"enter ns/c/e 2/3 2"}, "a:failing! b:failing! c:unknown"},
		}},
		{"stay", 0.5, []step{
			{func(g *joinRig) { three(g); g.verdict("a", fail); g.verdict("b", fail) }, []string{"enter ns/c/e 2/3 2"}, "a:failing! b:failing! c:unknown"},
			{func(g *joinRig) { g.verdict("c", fail) }, nil, "a:failing! b:failing! c:failing!"}, // joins the panic at once
			{func(g *joinRig) { g.verdict("c", pass) }, nil, "a:failing! b:failing! c:passing"},
			{func(g *joinRig) { g.put("d", false) }, nil, "a:failing! b:failing! c:passing d:-"}, // unchecked: counts for nothing
		}},
		{"leave", 0.5, []step{
			{func(g *joinRig) { three(g); g.verdict("a", fail); g.verdict("b", fail) }, []string{"enter ns/c/e 2/3 2"}, "a:failing! b:failing! c:unknown"},
			{func(g *joinRig) { g.unverdict("b") }, []string{"leave ns/c/e 1/3 1"}, "a:failing b:unknown c:unknown"},
		}},
		{"leave when a checked instance comes", 0.5, []step{
			{func(g *joinRig) { three(g); g.verdict("a", fail); g.verdict("b", fail) }, []string{"enter ns/c/e 2/3 2"}, "a:failing! b:failing! c:unknown"},
			{func(g *joinRig) { g.put("d", true) }, []string{"leave ns/c/e 2/4 2"}, "a:failing b:failing c:unknown d:unknown"},
		}},
		{"enter when a passing instance goes", 0.5, []step{
			{func(g *joinRig) { g.put("a", true); g.put("b", true); g.verdict("a", fail) }, nil, "a:failing b:unknown"},
			{func(g *joinRig) { g.remove("b") }, []string{"enter ns/c/e 1/1 1"}, "a:failing!"},
		}},
		{"leave when the last checked instance goes", 0.5, []step{
			{func(g *joinRig) { g.put("a", true); g.verdict("a", fail) }, []string{"enter ns/c/e 1/1 1"}, "a:failing!"},
			{func(g *joinRig) { g.remove("a") }, []string{"leave ns/c/e 0/0 0"}, ""},
			{func(g *joinRig) { g.put("a", true) }, []string{"enter ns/c/e 1/1 1"}, "a:failing!"}, // its verdict was kept aside
		}},
		{"leave when the check is dropped", 0.5, []step{
			{func(g *joinRig) { g.put("a", true); g.verdict("a", fail) }, []string{"enter ns/c/e 1/1 1"}, "a:failing!"},
			{func(g *joinRig) { g.put("a", false) }, []string{"leave ns/c/e 0/0 0"}, "a:-"},
		}},
		{"an intermediate state of a batch is no transition", 0.5, []step{
			{three, nil, "a:unknown b:unknown c:unknown"},
			{func(g *joinRig) { g.verdict("a", fail); g.verdict("b", fail); g.verdict("a", pass) }, nil, "a:passing b:failing c:unknown"},
		}},
		{"no checked instances", 0.5, []step{
			{func(g *joinRig) { g.put("a", false); g.put("b", false); g.verdict("a", fail); g.verdict("b", fail) }, nil, "a:- b:-"},
		}},
		{"threshold off", -1, []step{
			{func(g *joinRig) { three(g); g.verdict("a", fail); g.verdict("b", fail); g.verdict("c", fail) }, nil, "a:failing b:failing c:failing"},
		}},
		{"each service its own", 0.5, []step{
			{func(g *joinRig) {
				g.put("a", true)
				g.put("other/b", true)
				g.put("other/c", true)
				g.verdict("a", fail)
				g.verdict("other/b", fail)
			},
				[]string{"enter ns/c/e 1/1 1"}, "a:failing! b:failing c:unknown"},
			{func(g *joinRig) { g.verdict("other/c", fail) }, []string{"enter ns/c/other 2/2 2"}, "a:failing! b:failing! c:failing!"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newJoinRig(t, tc.threshold)
			for i, s := range tc.steps {
				s.do(g)
				if got := g.settle(); !slices.Equal(got, s.changes) {
					t.Fatalf("step %d: settle = %q, want %q", i, got, s.changes)
				}
				if got := g.health(); got != s.health {
					t.Fatalf("step %d: health %q, want %q", i, got, s.health)
				}
			}
		})
	}
}

// A join that ends (its feed stops) reports every service in panic as
// leaving it, once, and nothing afterwards.
func TestHealthJoinCloseLeavesEveryPanic(t *testing.T) {
	g := newJoinRig(t, 0.5)
	g.put("a", true)
	g.put("other/b", true)
	g.put("other/c", true)
	g.verdict("a", beacon.HealthFailing)
	g.settle()
	var got []string
	for _, c := range g.j.Close() {
		got = append(got, fmt.Sprintf("%s %v", c.Service, c.Enter))
	}
	if !slices.Equal(got, []string{"ns/c/e false"}) {
		t.Fatalf("close = %q, want ns/c/e leaving", got)
	}
	g.verdict("other/b", beacon.HealthFailing)
	g.verdict("other/c", beacon.HealthFailing)
	if got := g.settle(); len(got) != 0 || len(g.j.Close()) != 0 {
		t.Fatalf("after close: settle %q", got)
	}
}

// Verdicts: the stored one, without Panic; a change is reported once; a
// listing replaces them all and names the keys that changed.
func TestHealthJoinVerdicts(t *testing.T) {
	j := New(0.5)
	checked := beacon.Instance{Check: &beacon.Check{Kind: beacon.CheckTCP}}
	if h := j.Health("/services/ns/c/e/a", beacon.Instance{}); h != nil {
		t.Fatalf("an instance without a check carries %+v", h)
	}
	if h := j.Health("/services/ns/c/e/a", checked); h == nil || h.Status != beacon.HealthUnknown {
		t.Fatalf("a checked instance without a verdict carries %+v, want unknown", h)
	}
	v := beacon.Health{Status: beacon.HealthFailing, Reason: "refused", Checker: "c1", Panic: true}
	if !j.SetVerdict("/services/ns/c/e/a", v) || j.SetVerdict("/services/ns/c/e/a", v) {
		t.Fatal("setVerdict: a new verdict is a change, the same again is none")
	}
	if h := j.Health("/services/ns/c/e/a", checked); h.Status != beacon.HealthFailing || h.Reason != "refused" || h.Checker != "c1" || h.Panic {
		t.Fatalf("joined %+v, want the stored verdict without panic", h)
	}
	if h := j.Health("/services/ns/c/e/a", beacon.Instance{}); h != nil {
		t.Fatalf("an instance without a check carries its stored verdict %+v", h)
	}
	j.SetVerdict("/services/ns/c/e/b", v)
	changed := j.ReplaceVerdicts(map[string]beacon.Health{
		"/services/ns/c/e/a": v, // unchanged
		"/services/ns/c/e/c": {Status: beacon.HealthPassing},
	})
	if !slices.Equal(changed, []string{"/services/ns/c/e/b", "/services/ns/c/e/c"}) {
		t.Fatalf("replaceVerdicts changed %q", changed)
	}
	if !j.DeleteVerdict("/services/ns/c/e/a") || j.DeleteVerdict("/services/ns/c/e/a") {
		t.Fatal("deleteVerdict: the first deletes, the second finds none")
	}
}

// A service is counted while it has instances, checked or not (an
// unchecked one is failover for the earlier priorities), and forgotten
// once it has none; so is a priority level.
func TestHealthJoinForgetsServicesWithoutInstances(t *testing.T) {
	g := newJoinRig(t, 0.5)
	g.put("a", true)
	g.putAt("b", false, "20", "")
	g.settle()
	if len(g.j.services) != 1 || len(g.j.services["/services/ns/c/e/"].levels) != 2 {
		t.Fatalf("%d services counted, want 1 with 2 levels", len(g.j.services))
	}
	g.put("a", false)
	g.remove("b")
	g.settle()
	if s := g.j.services["/services/ns/c/e/"]; s == nil || len(s.levels) != 1 {
		t.Fatalf("service with one unchecked instance left: %+v, want it counted at one level", s)
	}
	g.remove("a")
	g.settle()
	if len(g.j.services) != 0 {
		t.Fatalf("%d services counted after the last instance went, want none", len(g.j.services))
	}
}
