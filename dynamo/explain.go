package dynamo

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
)

// Explaining one instance: why a Dynamo frontend would or would not see
// it. A frontend sees an instance when one entry holds it (a key under
// v1/instances/ in etcd, an entry of a DynamoWorkerMetadata's
// spec.data.endpoints on Kubernetes) and its value parses, while what
// keeps the entry alive does (its worker's lease in etcd; on Kubernetes,
// its resource's pod, Ready in an EndpointSlice); and the frontend routes
// a model's requests to it when the model's card names the instance's ID
// (frontends learn models from cards only). A Source says where the
// entries were read and what keeps them alive.

// Verdict is the outcome of one Check.
type Verdict string

const (
	// OK: nothing to do.
	OK Verdict = "ok"
	// Warn: the frontend sees the instance, but something may not be as
	// intended.
	Warn Verdict = "warn"
	// Fail: the frontend does not see the instance, or routes it nothing.
	Fail Verdict = "fail"
)

// Check is one line of an Explanation: what was checked, the verdict,
// what was found and, unless the verdict is OK, what to do.
type Check struct {
	Check   string  `json:"check"`
	Verdict Verdict `json:"verdict"`
	Found   string  `json:"found"`
	Do      string  `json:"do,omitempty"`
}

// Explanation says why a Dynamo frontend would or would not see one
// instance.
type Explanation struct {
	// Instance is the instance's Beacon ref (its ID in 16 hex digits).
	Instance beacon.Ref `json:"-"`
	// Seen: a frontend sees the instance (one entry holds it, its value
	// parses, and what keeps it alive does: Source.Live).
	Seen bool `json:"seen"`
	// Models are the models whose requests a frontend routes to it (its
	// cards' display names).
	Models []string `json:"models"`
	Checks []Check  `json:"checks"`
}

// KV is one stored entry, as Explain reads it: a key and value of an etcd
// store, or an entry of a DynamoWorkerMetadata's spec.data, Key being the
// etcd key of the same entry (the bucket's prefix and the entry's key).
type KV struct {
	Key         string
	Value       []byte
	ModRevision int64 // 0: not shown
	Lease       int64 // 0: none
	// Holder is the resource holding the entry, "" in a key/value store:
	// on Kubernetes, its DynamoWorkerMetadata (namespace/name).
	Holder string
}

// A Source is where Explain's entries were read and what keeps them
// alive: an etcd store (Etcd), or a Kubernetes cluster (registry/kube).
type Source interface {
	// Where names where the entry kv is stored.
	Where(kv KV) string
	// Missing says what to do when no entry holds the instance.
	Missing() string
	// Stale says how to remove stale entries among kvs, which all hold
	// the instance.
	Stale(kvs []KV) string
	// Live checks what keeps kv alive (etcd: its lease; Kubernetes: its
	// pod and the pod's readiness): with a Fail among them, frontends do
	// not see it.
	Live(kv KV) []Check
}

// LeaseState is what the store says of a lease.
type LeaseState struct {
	Known bool          // the store can tell (an etcd store can)
	Alive bool          // the lease exists
	Left  time.Duration // its time to live
	TTL   time.Duration // the TTL it was granted with
}

// Etcd is the Source of entries read from an etcd store (ComponentPrefixes),
// lease saying what the store says of a lease ID: a key lives as long as
// its lease.
func Etcd(lease func(id int64) LeaseState) Source { return etcdSource{lease: lease} }

type etcdSource struct{ lease func(id int64) LeaseState }

func (etcdSource) Where(kv KV) string { return kv.Key }

func (etcdSource) Missing() string {
	return "the worker never registered this endpoint, or its lease ended: check that it runs, that its ETCD_ENDPOINTS is this etcd " +
		"and DYN_DISCOVERY_BACKEND etcd, and its logs for lease errors"
}

func (etcdSource) Stale([]KV) string { return "delete the stale key (etcdctl del KEY)" }

func (s etcdSource) Live(kv KV) []Check { return []Check{leaseCheck(kv, s.lease)} }

// ParseInstance reads "namespace/component/endpoint/id", the ID in hex as
// Dynamo's key has it (2a) or padded as Beacon shows it
// (000000000000002a).
func ParseInstance(s string) (beacon.Ref, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 {
		return beacon.Ref{}, fmt.Errorf("instance %q: want namespace/component/endpoint/id, the id in hex as in Dynamo's key (2a)", shorten(s))
	}
	id, err := parseHexID(parts[3])
	if err != nil {
		return beacon.Ref{}, fmt.Errorf("instance %q: %w", shorten(s), err)
	}
	ref := beacon.Ref{Namespace: parts[0], Component: parts[1], Endpoint: parts[2], ID: beacon.FormatID(id)}
	if err := ref.Validate(); err != nil {
		return beacon.Ref{}, err
	}
	return ref, nil
}

// ComponentPrefixes are the prefixes Explain reads for ref: the instances
// and the model cards of its component.
func ComponentPrefixes(ref beacon.Ref) []string {
	rest := ref.Namespace + "/" + ref.Component + "/"
	return []string{InstancesPrefix + rest, ModelsPrefix + rest}
}

// Explain says why a Dynamo frontend would or would not see the instance
// at ref, from kvs (the entries of its component: ComponentPrefixes in
// etcd) read from src.
func Explain(ref beacon.Ref, kvs []KV, src Source) Explanation {
	x := Explanation{Instance: ref}
	ins := matching(ref, kvs, KindEndpoint, true)
	served, ok := x.checkInstance(ref, ins, kvs, src)
	x.Seen = ok
	x.checkName(ref)
	x.checkCards(ref, kvs, served, src)
	return x
}

func (x *Explanation) add(check string, v Verdict, found, do string) {
	x.Checks = append(x.Checks, Check{Check: check, Verdict: v, Found: found, Do: do})
}

// matching returns the entries of kind whose key names ref's instance (on
// ref's endpoint, or on any endpoint of its component).
func matching(ref beacon.Ref, kvs []KV, kind Kind, sameEndpoint bool) []KV {
	var out []KV
	for _, kv := range kvs {
		k, err := ParseKey(kv.Key)
		if err != nil || k.Kind != kind {
			continue
		}
		r := k.Ref()
		if r.ID == ref.ID && r.Namespace == ref.Namespace && r.Component == ref.Component && (!sameEndpoint || r.Endpoint == ref.Endpoint) {
			out = append(out, kv)
		}
	}
	return out
}

// checkInstance checks the entries holding the instance (ins): there is
// one, or one per holder; each parses and is alive. It returns the entry
// frontends see and whether there is one.
func (x *Explanation) checkInstance(ref beacon.Ref, ins, kvs []KV, src Source) (KV, bool) {
	if len(ins) == 0 {
		do := src.Missing()
		if others := endpointsOf(matching(ref, kvs, KindEndpoint, false)); len(others) > 0 {
			do = "the instance registered " + strings.Join(others, ", ") + " of this component, not this endpoint: check the endpoint's name"
		}
		x.add("key", Fail, "no "+src.Where(KV{Key: InstanceKey(ref)}), do)
		return KV{}, false
	}
	holders, byHolder := groupByHolder(ins)
	if len(holders) == 1 {
		checks, live := entryChecks(ins, src)
		x.Checks = append(x.Checks, checks...)
		return ins[0], live
	}
	var (
		checks     []Check
		live, dead []KV
	)
	for _, h := range holders {
		cs, ok := entryChecks(byHolder[h], src)
		for _, c := range cs {
			c.Found = h + ": " + c.Found
			checks = append(checks, c)
		}
		if ok {
			live = append(live, byHolder[h][0])
		} else {
			dead = append(dead, byHolder[h]...)
		}
	}
	held := fmt.Sprintf("%d resources hold this instance: %s", len(holders), strings.Join(holders, ", "))
	switch len(live) {
	case 0:
		x.add("key", Fail, held+"; in none is it alive", "see the checks of each below")
	case 1:
		x.add("key", Warn, held+"; frontends see "+live[0].Holder+"'s, the only one alive", "the others are stale: "+src.Stale(dead))
	default:
		x.add("key", Fail, held+", alive in more than one",
			"frontends keep whichever they read last and Beacon serves none: two workers have one instance ID, or all but one are stale: "+src.Stale(live))
	}
	x.Checks = append(x.Checks, checks...)
	if len(live) == 1 {
		return live[0], true
	}
	return KV{}, false
}

// groupByHolder returns the holders of kvs, sorted, and their entries.
func groupByHolder(kvs []KV) ([]string, map[string][]KV) {
	by := map[string][]KV{}
	for _, kv := range kvs {
		by[kv.Holder] = append(by[kv.Holder], kv)
	}
	return slices.Sorted(maps.Keys(by)), by
}

// entryChecks checks the entries of one holder that hold the instance:
// one key, its value, what keeps it alive. It says whether frontends see
// it.
func entryChecks(ins []KV, src Source) ([]Check, bool) {
	if len(ins) > 1 {
		where := make([]string, len(ins))
		for i, kv := range ins {
			where[i] = src.Where(kv)
		}
		return []Check{{Check: "key", Verdict: Fail, Found: "several keys hold this instance ID: " + strings.Join(where, ", "),
			Do: "frontends keep whichever they read last and Beacon serves none: " + src.Stale(ins)}}, false
	}
	kv := ins[0]
	found := src.Where(kv)
	if kv.ModRevision != 0 {
		found += fmt.Sprintf(" (revision %d)", kv.ModRevision)
	}
	checks := []Check{{Check: "key", Verdict: OK, Found: found}, valueCheck(kv)}
	if checks[1].Verdict == Fail {
		return checks, false
	}
	live := src.Live(kv)
	return append(checks, live...), !slices.ContainsFunc(live, func(c Check) bool { return c.Verdict == Fail })
}

func endpointsOf(kvs []KV) []string {
	var out []string
	for _, kv := range kvs {
		if k, err := ParseKey(kv.Key); err == nil {
			out = append(out, k.Endpoint)
		}
	}
	return out
}

func valueCheck(kv KV) Check {
	e, err := Decode(kv.Key, kv.Value)
	var ee *EntryError
	if errors.As(err, &ee) {
		err = ee.Err
	}
	if err != nil {
		return Check{Check: "value", Verdict: Fail, Found: err.Error(), Do: "frontends skip a value they cannot parse: the worker's runtime wrote it wrongly, " +
			"or someone else wrote the entry; restart the worker (it registers again), or delete the entry"}
	}
	return Check{Check: "value", Verdict: OK, Found: fmt.Sprintf("Endpoint, %s %s", e.Instance.Transport, e.Instance.Metadata[MetaTarget])}
}

func leaseCheck(kv KV, lease func(int64) LeaseState) Check {
	id := strconv.FormatInt(kv.Lease, 16)
	if kv.Lease == 0 {
		return Check{Check: "lease", Verdict: Warn, Found: "the key has no lease: it never goes by itself",
			Do: "if the worker is gone, frontends still route to it: delete the key (etcdctl del " + kv.Key + ")"}
	}
	st := lease(kv.Lease)
	switch {
	case !st.Known:
		return Check{Check: "lease", Verdict: Warn, Found: "lease " + id + ": the store cannot say how long it has left"}
	case !st.Alive:
		return Check{Check: "lease", Verdict: Fail, Found: "lease " + id + " has ended", Do: "the key goes with it: the worker must register again (restart it)"}
	}
	return Check{Check: "lease", Verdict: OK, Found: fmt.Sprintf("lease %s alive, %v of %v left", id, st.Left, st.TTL)}
}

func (x *Explanation) checkName(ref beacon.Ref) {
	served := "served by Beacon as " + ref.String()
	if err := beacon.CheckDNSName(ref.Namespace, ref.Endpoint); err != nil {
		x.add("name", Warn, served+"; not in DNS: "+err.Error(), "reach it through Beacon's HTTP API, the beacon:/// resolver or xDS")
		return
	}
	x.add("name", OK, served+"; in DNS as "+ref.Endpoint+"."+ref.Component+"."+ref.Namespace, "")
}

// checkCards checks the model cards of the instance: those beside the
// entry frontends see (served: in the same resource on Kubernetes), or,
// without one (served.Key ""), all of them.
func (x *Explanation) checkCards(ref beacon.Ref, kvs []KV, served KV, src Source) {
	if served.Key != "" {
		kvs = slices.DeleteFunc(slices.Clone(kvs), func(kv KV) bool { return kv.Holder != served.Holder })
	}
	var found []string
	own := matching(ref, kvs, KindModel, true)
	for _, kv := range own {
		e, err := Decode(kv.Key, kv.Value)
		if err != nil {
			x.add("model card", Fail, err.Error(), "frontends skip a card they cannot parse: restart the worker to write it again")
			continue
		}
		x.Models = append(x.Models, e.Model)
		found = append(found, e.Model+" ("+src.Where(kv)+")")
	}
	if len(found) > 0 {
		x.add("model card", OK, strings.Join(found, ", "), "")
	}
	if len(own) > 0 {
		return
	}
	if others := endpointsOf(matching(ref, kvs, KindModel, false)); len(others) > 0 {
		x.add("model card", OK, "none on this endpoint; the instance's cards are on "+strings.Join(others, ", "), "")
		return
	}
	x.add("model card", Warn, "none under "+src.Where(KV{Key: ModelsKeyPrefix(ref), Holder: served.Holder})+" nor on another endpoint of this instance",
		"frontends learn models from cards only: they route no model's requests here. Right for an endpoint that serves "+
			"no model (clear_kv_blocks, load_metrics); for a model's endpoint, the worker has not registered its model yet "+
			"(it does once the model is loaded): check its logs")
}

// Verdict sums the explanation up in one sentence.
func (x Explanation) Verdict() string {
	switch {
	case !x.Seen:
		return "a Dynamo frontend would not see this instance"
	case len(x.Models) == 0:
		return "a Dynamo frontend would see this instance, but route no model's requests to it (no model card on it)"
	}
	return "a Dynamo frontend would see this instance and route " + strings.Join(x.Models, ", ") + " requests to it"
}
