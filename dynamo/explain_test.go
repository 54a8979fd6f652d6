package dynamo_test

import (
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/dynamo"
)

func verdicts(x dynamo.Explanation) string {
	var parts []string
	for _, c := range x.Checks {
		parts = append(parts, c.Check+"="+string(c.Verdict))
	}
	return strings.Join(parts, " ")
}

// TestExplain pins each verdict of Explain: what makes a frontend see an
// instance (key, value, lease), what it routes to it (cards), and what
// Beacon serves of its name.
func TestExplain(t *testing.T) {
	ref, err := dynamo.ParseInstance("dynamo/backend/generate/2a")
	if err != nil || ref.ID != "000000000000002a" {
		t.Fatalf("ParseInstance = %v, %v", ref, err)
	}
	if got := dynamo.ComponentPrefixes(ref); strings.Join(got, " ") != "v1/instances/dynamo/backend/ v1/mdc/dynamo/backend/" {
		t.Fatalf("ComponentPrefixes = %v", got)
	}
	const key = "v1/instances/dynamo/backend/generate/2a"
	inst := dynamo.KV{Key: key, Value: []byte(tcpValue), ModRevision: 7, Lease: 0x694d}
	card := dynamo.KV{Key: "v1/mdc/dynamo/backend/generate/2a", Value: []byte(modelValue), ModRevision: 8, Lease: 0x694d}
	alive := func(int64) dynamo.LeaseState {
		return dynamo.LeaseState{Known: true, Alive: true, Left: 7 * time.Second, TTL: 10 * time.Second}
	}
	other := func(ep string) dynamo.KV {
		v := strings.ReplaceAll(tcpValue, `"endpoint":"generate"`, `"endpoint":"`+ep+`"`)
		return dynamo.KV{Key: "v1/instances/dynamo/backend/" + ep + "/2a", Value: []byte(v), Lease: 0x694d}
	}
	otherCard := dynamo.KV{Key: "v1/mdc/dynamo/backend/generate/2a",
		Value: []byte(modelValue)}
	for _, tc := range []struct {
		name     string
		ref      string
		kvs      []dynamo.KV
		lease    func(int64) dynamo.LeaseState
		want     string
		seen     bool
		verdict  string
		mentions string
	}{
		{"all fine", "", []dynamo.KV{inst, card}, alive,
			"key=ok value=ok lease=ok name=ok model card=ok", true,
			"would see this instance and route Qwen/Qwen3-0.6B requests to it", "7s of 10s left"},
		{"no key", "", []dynamo.KV{card}, alive, "key=fail name=ok model card=ok", false,
			"would not see this instance", "ETCD_ENDPOINTS"},
		{"another endpoint of the instance", "", []dynamo.KV{other("load_metrics")}, alive, "key=fail name=ok model card=warn", false,
			"would not see", "registered load_metrics of this component"},
		{"padded and unpadded", "", []dynamo.KV{inst, {Key: "v1/instances/dynamo/backend/generate/002a", Value: []byte(tcpValue)}, card}, alive,
			"key=fail name=ok model card=ok", false, "would not see", "delete the stale key"},
		{"not JSON", "", []dynamo.KV{{Key: key, Value: []byte("garbage")}}, alive, "key=ok value=fail name=ok model card=warn", false,
			"would not see", "cannot parse"},
		{"no lease", "", []dynamo.KV{{Key: key, Value: []byte(tcpValue)}, card}, alive,
			"key=ok value=ok lease=warn name=ok model card=ok", true, "route Qwen", "etcdctl del " + key},
		{"lease ended", "", []dynamo.KV{inst}, func(int64) dynamo.LeaseState { return dynamo.LeaseState{Known: true} },
			"key=ok value=ok lease=fail name=ok model card=warn", false, "would not see", "has ended"},
		{"store cannot say", "", []dynamo.KV{inst, card}, func(int64) dynamo.LeaseState { return dynamo.LeaseState{} },
			"key=ok value=ok lease=warn name=ok model card=ok", true, "route Qwen", "cannot say"},
		{"cards on another endpoint", "dynamo/backend/clear_kv_blocks/2a", []dynamo.KV{other("clear_kv_blocks"), otherCard}, alive,
			"key=ok value=ok lease=ok name=ok model card=ok", true, "route no model's requests", "cards are on generate"},
		{"no card", "", []dynamo.KV{inst}, alive, "key=ok value=ok lease=ok name=ok model card=warn", true,
			"route no model's requests", "once the model is loaded"},
		{"bad card", "", []dynamo.KV{inst, {Key: card.Key, Value: []byte(`{"type":"Model"}`)}}, alive,
			"key=ok value=ok lease=ok name=ok model card=fail", true, "route no model's", "cannot parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ref
			if tc.ref != "" {
				if r, err = dynamo.ParseInstance(tc.ref); err != nil {
					t.Fatal(err)
				}
			}
			x := dynamo.Explain(r, tc.kvs, dynamo.Etcd(tc.lease))
			all := ""
			for _, c := range x.Checks {
				all += c.Found + " " + c.Do + "\n"
				if (c.Verdict == dynamo.OK) != (c.Do == "") && !(c.Verdict == dynamo.Warn && c.Check == "lease" && c.Do == "") {
					t.Errorf("%s: %s says what to do %q", c.Check, c.Verdict, c.Do)
				}
			}
			if got := verdicts(x); got != tc.want || x.Seen != tc.seen || !strings.Contains(x.Verdict(), tc.verdict) ||
				!strings.Contains(all, tc.mentions) {
				t.Fatalf("Explain: %s seen=%v %q\n%s\nwant %s seen=%v %q, mentioning %q", got, x.Seen, x.Verdict(), all,
					tc.want, tc.seen, tc.verdict, tc.mentions)
			}
		})
	}
}

func TestExplainNames(t *testing.T) {
	ref, err := dynamo.ParseInstance("dynamo.t_1/backend/_x/000000000000002a")
	if err != nil {
		t.Fatal(err)
	}
	x := dynamo.Explain(ref, nil, dynamo.Etcd(nil))
	if c := x.Checks[1]; c.Check != "name" || c.Verdict != dynamo.Warn || !strings.Contains(c.Found, "not in DNS") {
		t.Fatalf("name check %+v", c)
	}
	for _, bad := range []string{"a/b/c", "a/b/c/2A", "a/b.c/d/2a", "a/b/c/10000000000000000"} {
		if _, err := dynamo.ParseInstance(bad); err == nil {
			t.Errorf("ParseInstance(%q) accepted", bad)
		}
	}
}

// resources is a Source whose entries are held by resources (as on
// Kubernetes), alive when the map says so: what registry/kube's Source
// says of a resource's pod, without a cluster.
type resources map[string]bool

func (resources) Where(kv dynamo.KV) string {
	if kv.Holder == "" {
		return "any resource's " + kv.Key
	}
	return kv.Holder + "'s " + kv.Key
}

func (resources) Missing() string { return "start the worker" }

func (resources) Stale(kvs []dynamo.KV) string {
	var hs []string
	for _, kv := range kvs {
		hs = append(hs, kv.Holder)
	}
	return "delete " + strings.Join(hs, " ")
}

func (r resources) Live(kv dynamo.KV) []dynamo.Check {
	if r[kv.Holder] {
		return []dynamo.Check{{Check: "pod", Verdict: dynamo.OK, Found: "there"}, {Check: "readiness", Verdict: dynamo.OK, Found: "Ready"}}
	}
	return []dynamo.Check{{Check: "pod", Verdict: dynamo.Warn, Found: "cannot say", Do: "grant get"},
		{Check: "readiness", Verdict: dynamo.Fail, Found: "not Ready", Do: "wait"}}
}

// TestExplainHolders pins how Explain weighs entries held by resources
// (Kubernetes' DynamoWorkerMetadata): the Source's checks in place of the
// lease, one resource alive among several seen (the others stale), two
// alive or none not seen, two keys in one resource never, and the model
// cards of the resource seen only.
func TestExplainHolders(t *testing.T) {
	ref, err := dynamo.ParseInstance("dynamo/backend/generate/2a")
	if err != nil {
		t.Fatal(err)
	}
	const key = "v1/instances/dynamo/backend/generate/2a"
	in := func(holder string) dynamo.KV { return dynamo.KV{Key: key, Value: []byte(tcpValue), Holder: holder} }
	card := func(holder string) dynamo.KV {
		return dynamo.KV{Key: "v1/mdc/dynamo/backend/generate/2a", Value: []byte(modelValue), Holder: holder}
	}
	padded := dynamo.KV{Key: "v1/instances/dynamo/backend/generate/002a", Value: []byte(tcpValue), Holder: "ns/a"}
	for _, tc := range []struct {
		name     string
		kvs      []dynamo.KV
		alive    resources
		want     string
		seen     bool
		mentions string
	}{
		{"one, alive", []dynamo.KV{in("ns/a"), card("ns/a")}, resources{"ns/a": true},
			"key=ok value=ok pod=ok readiness=ok name=ok model card=ok", true, "Qwen/Qwen3-0.6B (ns/a's v1/mdc/"},
		{"one, not alive", []dynamo.KV{in("ns/a"), card("ns/a")}, resources{},
			"key=ok value=ok pod=warn readiness=fail name=ok model card=ok", false, "not Ready — wait"},
		{"none", []dynamo.KV{card("ns/a")}, resources{}, "key=fail name=ok model card=ok", false,
			"no any resource's " + key + " — start the worker"},
		{"two, both alive", []dynamo.KV{in("ns/a"), in("ns/b")}, resources{"ns/a": true, "ns/b": true},
			"key=fail key=ok value=ok pod=ok readiness=ok key=ok value=ok pod=ok readiness=ok name=ok model card=warn", false,
			"2 resources hold this instance: ns/a, ns/b, alive in more than one — frontends keep whichever they read last and Beacon serves none: two workers have one instance ID, or all but one are stale: delete ns/a ns/b"},
		{"two, one alive", []dynamo.KV{in("ns/a"), in("ns/b"), card("ns/a"), card("ns/b")}, resources{"ns/b": true},
			"key=warn key=ok value=ok pod=warn readiness=fail key=ok value=ok pod=ok readiness=ok name=ok model card=ok", true,
			"frontends see ns/b's, the only one alive — the others are stale: delete ns/a"},
		{"two, none alive", []dynamo.KV{in("ns/a"), in("ns/b")}, resources{},
			"key=fail key=ok value=ok pod=warn readiness=fail key=ok value=ok pod=warn readiness=fail name=ok model card=warn", false,
			"ns/b: not Ready"},
		{"cards of another resource", []dynamo.KV{in("ns/a"), card("ns/b")}, resources{"ns/a": true},
			"key=ok value=ok pod=ok readiness=ok name=ok model card=warn", true, "none under ns/a's v1/mdc/dynamo/backend/generate/2a"},
		{"two keys in one resource", []dynamo.KV{in("ns/a"), padded, card("ns/a")}, resources{"ns/a": true},
			"key=fail name=ok model card=ok", false, "several keys hold this instance ID: ns/a's " + key + ", ns/a's " + padded.Key},
		{"bad value in one of two", []dynamo.KV{{Key: key, Value: []byte("{"), Holder: "ns/a"}, in("ns/b")}, resources{"ns/a": true, "ns/b": true},
			"key=warn key=ok value=fail key=ok value=ok pod=ok readiness=ok name=ok model card=warn", true, "ns/a: value is not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := dynamo.Explain(ref, tc.kvs, tc.alive)
			all := ""
			for _, c := range x.Checks {
				all += c.Found + " — " + c.Do + "\n"
			}
			if got := verdicts(x); got != tc.want || x.Seen != tc.seen || !strings.Contains(all, tc.mentions) {
				t.Fatalf("Explain: %s seen=%v\n%s\nwant %s seen=%v, mentioning %q", got, x.Seen, all, tc.want, tc.seen, tc.mentions)
			}
		})
	}
}
