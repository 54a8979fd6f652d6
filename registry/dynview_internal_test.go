package registry

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/dynamo"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// dynRig is a feed of the dynamo layout, for query "feed", fed listings
// and events by hand.
type dynRig struct {
	*feedRig
	logs *records
}

func newDynRig(t *testing.T) *dynRig {
	t.Helper()
	logs := &records{}
	return &dynRig{feedRig: newFeedRigWith(t, Config{Layout: LayoutDynamo, RemovalHold: -1, Logger: slog.New(logs)}), logs: logs}
}

// endpointKV is the value Dynamo writes for instance id (hex) of
// feed/backend/generate at addr, as stored at key.
func endpointKV(key, id, dec, addr string, create, mod int64, lease store.LeaseID) store.KeyValue {
	val := `{"type":"Endpoint","namespace":"feed","component":"backend","endpoint":"generate","instance_id":` + dec +
		`,"transport":{"tcp":"` + addr + `/generate"},"request_plane_codec":"msgpack"}`
	if key == "" {
		key = "v1/instances/feed/backend/generate/" + id
	}
	return store.KeyValue{Key: key, Value: []byte(val), CreateRevision: create, ModRevision: mod, Lease: lease}
}

func cardKV(key, dec, model string, mod int64) store.KeyValue {
	val := `{"type":"Model","namespace":"feed","component":"backend","endpoint":"generate","instance_id":` + dec +
		`,"card_json":{"display_name":"` + model + `"},"model_suffix":null}`
	return store.KeyValue{Key: key, Value: []byte(val), CreateRevision: mod, ModRevision: mod}
}

func models(b Batch) []string {
	var out []string
	for _, e := range b.Events {
		out = append(out, e.Type.String()+" "+e.Instance.Address+" "+e.Instance.Metadata[dynamo.MetaModels])
	}
	return out
}

func wantModels(t *testing.T, b Batch, kind BatchKind, want ...string) {
	t.Helper()
	if got := models(b); b.Kind != kind || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("batch %v %q, want %v %q", b.Kind, got, kind, want)
	}
}

// A card is joined to its instance: written or deleted, it is an Updated
// event of the instance at the card's revision; the instance's deletion is
// its removal, whatever cards stay.
func TestDynamoFeedJoinsCards(t *testing.T) {
	g := newDynRig(t)
	g.f.applyListing([]store.KeyValue{
		endpointKV("", "2a", "42", "10.0.0.1:9999", 5, 5, 7),
		cardKV("v1/mdc/feed/backend/generate/2a", "42", "Qwen/Qwen3-0.6B", 6),
	}, 10)
	c := &cursor{}
	b := g.batch(c)
	wantModels(t, b, Snapshot, "added 10.0.0.1:9999 Qwen/Qwen3-0.6B")
	if in := b.Events[0].Instance; in.ID != "000000000000002a" || in.Metadata[dynamo.MetaInstanceID] != "42" || b.Events[0].Revision != 6 {
		t.Fatalf("snapshot instance %+v at %d", in, b.Events[0].Revision)
	}
	if it, _ := g.f.view.Get(dynViewKey(b.Events[0].Instance.Ref())); it.Lease != 7 || it.Create != 5 || it.Mod != 5 {
		t.Fatalf("item %+v: want the instance entry's lease and revisions", it)
	}
	g.f.applyEvents([]store.Event{put(cardKV("v1/mdc/feed/backend/generate/2a/lora", "42", "lora", 11))})
	b = g.batch(c)
	wantModels(t, b, Changes, "updated 10.0.0.1:9999 Qwen/Qwen3-0.6B,lora")
	if b.Events[0].Revision != 11 {
		t.Fatalf("card's update at %d, want 11", b.Events[0].Revision)
	}
	g.f.applyEvents([]store.Event{del("v1/mdc/feed/backend/generate/2a", 12)})
	wantModels(t, g.batch(c), Changes, "updated 10.0.0.1:9999 lora")
	g.f.applyEvents([]store.Event{del("v1/instances/feed/backend/generate/2a", 13)})
	wantModels(t, g.batch(c), Changes, "removed 10.0.0.1:9999 lora")
	g.f.applyEvents([]store.Event{del("v1/mdc/feed/backend/generate/2a/lora", 14)}) // the lease's other key
	g.idle(c)
	g.f.applyEvents([]store.Event{put(endpointKV("", "2a", "42", "10.0.0.2:9999", 15, 15, 8))})
	wantModels(t, g.batch(c), Changes, "added 10.0.0.2:9999 ")
}

// A key whose new value Beacon cannot serve keeps its last valid entry,
// through the watch and through a re-listing, and is reported once per
// revision; a re-listing without the key removes it.
func TestDynamoFeedKeepsLastValidEntry(t *testing.T) {
	g := newDynRig(t)
	c := &cursor{}
	g.f.applyListing([]store.KeyValue{endpointKV("", "2a", "42", "10.0.0.1:9999", 5, 5, 7)}, 10)
	wantModels(t, g.batch(c), Snapshot, "added 10.0.0.1:9999 ")
	bad := store.KeyValue{Key: "v1/instances/feed/backend/generate/2a", Value: []byte("garbage"), CreateRevision: 5, ModRevision: 11}
	g.f.applyEvents([]store.Event{put(bad)})
	g.idle(c)
	g.f.applyListing([]store.KeyValue{bad}, 12)
	g.f.applyListing([]store.KeyValue{bad}, 13)
	g.idle(c)
	if it, ok := g.f.view.Get("v1/instances/feed/backend/generate/000000000000002a"); !ok || it.Inst.Address != "10.0.0.1:9999" {
		t.Fatalf("the last valid entry is gone: %+v", it)
	}
	if got := g.reported("v1/instances/feed/backend/generate/2a"); got != 1 || testutil.ToFloat64(g.r.m.invalid) != 1 {
		t.Fatalf("the malformed entry was reported %d times (counted %v), want once: %q", got, testutil.ToFloat64(g.r.m.invalid), g.logs.lines())
	}
	g.f.applyListing(nil, 14)
	wantModels(t, g.batch(c), Resync, "removed 10.0.0.1:9999 ")
}

func (g *dynRig) reported(key string) int {
	n := 0
	for _, l := range g.logs.lines() {
		if strings.HasPrefix(l, "ERROR ") && strings.HasSuffix(l, "key="+key) {
			n++
		}
	}
	return n
}

// Two instance entries of one ref (a padded and an unpadded ID) remove it
// and are each reported once; when one goes, the other is served.
func TestDynamoFeedRefusesCollisions(t *testing.T) {
	g := newDynRig(t)
	c := &cursor{}
	g.f.applyListing([]store.KeyValue{endpointKV("", "2a", "42", "10.0.0.1:9999", 5, 5, 7)}, 10)
	wantModels(t, g.batch(c), Snapshot, "added 10.0.0.1:9999 ")
	const padded = "v1/instances/feed/backend/generate/000000000000002a"
	g.f.applyEvents([]store.Event{put(endpointKV(padded, "", "42", "10.0.0.2:9999", 11, 11, 8))})
	wantModels(t, g.batch(c), Changes, "removed 10.0.0.1:9999 ")
	g.f.applyListing([]store.KeyValue{endpointKV("", "2a", "42", "10.0.0.1:9999", 5, 5, 7), endpointKV(padded, "", "42", "10.0.0.2:9999", 11, 11, 8)}, 12)
	g.idle(c)
	for _, key := range []string{padded, "v1/instances/feed/backend/generate/2a"} {
		if got := g.reported(key); got != 1 {
			t.Fatalf("%s reported %d times, want once: %q", key, got, g.logs.lines())
		}
	}
	if n := testutil.ToFloat64(g.r.m.invalid); n != 2 {
		t.Fatalf("beacon_registry_invalid_values_total %v, want 2 (each key of the collision)", n)
	}
	g.f.applyEvents([]store.Event{del("v1/instances/feed/backend/generate/2a", 13)})
	wantModels(t, g.batch(c), Changes, "added 10.0.0.2:9999 ")
}

// A feed serves its query's instances only, and skips the buckets that
// hold no instances without a word.
func TestDynamoFeedSelectsItsQuery(t *testing.T) {
	g := newDynRig(t)
	other := endpointKV("v1/instances/feed.sub/backend/generate/2a", "", "42", "10.0.0.9:9999", 5, 5, 7)
	other.Value = []byte(strings.Replace(string(other.Value), `"namespace":"feed"`, `"namespace":"feed.sub"`, 1))
	g.f.applyListing([]store.KeyValue{
		other,
		{Key: "v1/event_channels/namespace/feed/topic/kv-events/2a", Value: []byte(`{"type":"EventChannel"}`), ModRevision: 6},
		endpointKV("", "2b", "43", "10.0.0.1:9999", 7, 7, 7),
	}, 10)
	wantModels(t, g.batch(&cursor{}), Snapshot, "added 10.0.0.1:9999 ")
	if lines := g.logs.lines(); len(lines) != 0 {
		t.Fatalf("logged %q", lines)
	}
}

// A reporter reports each key once per revision, and forgets what it
// reported past maxReported keys (a key may then be reported again),
// so that it never grows without bound.
func TestReporterBound(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := newReporter(slog.New(slog.DiscardHandler), m, maxReported)
	n := 0
	report := func(key string, rev int64) {
		if p.first(key, rev) {
			n++
		}
	}
	report("k0", 1)
	report("k0", 1)
	report("k0", 2)
	if n != 2 {
		t.Fatalf("%d reports, want 2 (revisions 1 and 2)", n)
	}
	for i := 1; i < maxReported; i++ {
		report(fmt.Sprint("k", i), 1)
	}
	report("k0", 2) // still remembered
	if n != 1+maxReported {
		t.Fatalf("%d reports, want %d", n, 1+maxReported)
	}
	report("one-too-many", 1) // past the bound: forgets
	report("k0", 2)
	if seen := len(p.seen); n != 3+maxReported || seen != 2 {
		t.Fatalf("%d reports, %d remembered; want %d and 2", n, seen, 3+maxReported)
	}
}
