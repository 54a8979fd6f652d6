package dynamo

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
)

// Explaining one instance: why a Dynamo frontend would or would not see
// it. A frontend sees an instance when its key is under v1/instances/ and
// its value parses; the key lives as long as its worker's lease; and the
// frontend routes a model's requests to it when the model's card is under
// v1/mdc/ with the instance's ID (frontends learn models from cards only).

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
	// Seen: a frontend sees the instance (key, value and lease are fine).
	Seen bool `json:"seen"`
	// Models are the models whose requests a frontend routes to it (its
	// cards' display names).
	Models []string `json:"models"`
	Checks []Check  `json:"checks"`
}

// KV is one stored key/value, as Explain reads it.
type KV struct {
	Key         string
	Value       []byte
	ModRevision int64
	Lease       int64 // 0: none
}

// LeaseState is what the store says of a lease.
type LeaseState struct {
	Known bool          // the store can tell (an etcd store can)
	Alive bool          // the lease exists
	Left  time.Duration // its time to live
	TTL   time.Duration // the TTL it was granted with
}

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
// at ref, from kvs (what ComponentPrefixes hold) and lease (what the store
// says of a lease ID).
func Explain(ref beacon.Ref, kvs []KV, lease func(id int64) LeaseState) Explanation {
	x := Explanation{Instance: ref}
	ins := matching(ref, kvs, KindEndpoint, true)
	ok := x.checkKey(ref, ins, kvs)
	if ok {
		ok = x.checkValue(ins[0])
	}
	if ok {
		ok = x.checkLease(ins[0], lease)
	}
	x.Seen = ok
	x.checkName(ref)
	x.checkCards(ref, kvs)
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

func (x *Explanation) checkKey(ref beacon.Ref, ins, kvs []KV) bool {
	key := InstanceKey(ref)
	switch len(ins) {
	case 0:
		do := "the worker never registered this endpoint, or its lease ended: check that it runs, that its ETCD_ENDPOINTS is this etcd " +
			"and DYN_DISCOVERY_BACKEND etcd, and its logs for lease errors"
		if others := endpointsOf(matching(ref, kvs, KindEndpoint, false)); len(others) > 0 {
			do = "the instance registered " + strings.Join(others, ", ") + " of this component, not this endpoint: check the endpoint's name"
		}
		x.add("key", Fail, "no "+key, do)
		return false
	case 1:
		x.add("key", OK, fmt.Sprintf("%s (revision %d)", ins[0].Key, ins[0].ModRevision), "")
		return true
	}
	keys := make([]string, len(ins))
	for i, kv := range ins {
		keys[i] = kv.Key
	}
	x.add("key", Fail, "several keys hold this instance ID: "+strings.Join(keys, ", "),
		"frontends keep whichever they read last and Beacon serves none: delete the stale key (etcdctl del KEY)")
	return false
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

func (x *Explanation) checkValue(kv KV) bool {
	e, err := Decode(kv.Key, kv.Value)
	var ee *EntryError
	if errors.As(err, &ee) {
		err = ee.Err
	}
	if err != nil {
		x.add("value", Fail, err.Error(), "frontends skip a value they cannot parse: the worker's runtime wrote it wrongly, "+
			"or someone else wrote the key; restart the worker (its lease ends and it registers again), or delete the key")
		return false
	}
	x.add("value", OK, fmt.Sprintf("Endpoint, %s %s", e.Instance.Transport, e.Instance.Metadata[MetaTarget]), "")
	return true
}

func (x *Explanation) checkLease(kv KV, lease func(int64) LeaseState) bool {
	id := strconv.FormatInt(kv.Lease, 16)
	if kv.Lease == 0 {
		x.add("lease", Warn, "the key has no lease: it never goes by itself",
			"if the worker is gone, frontends still route to it: delete the key (etcdctl del "+kv.Key+")")
		return true
	}
	st := lease(kv.Lease)
	switch {
	case !st.Known:
		x.add("lease", Warn, "lease "+id+": the store cannot say how long it has left", "")
		return true
	case !st.Alive:
		x.add("lease", Fail, "lease "+id+" has ended", "the key goes with it: the worker must register again (restart it)")
		return false
	}
	x.add("lease", OK, fmt.Sprintf("lease %s alive, %v of %v left", id, st.Left, st.TTL), "")
	return true
}

func (x *Explanation) checkName(ref beacon.Ref) {
	served := "served by Beacon as " + ref.String()
	if err := beacon.CheckDNSName(ref.Namespace, ref.Endpoint); err != nil {
		x.add("name", Warn, served+"; not in DNS: "+err.Error(), "reach it through Beacon's HTTP API, the beacon:/// resolver or xDS")
		return
	}
	x.add("name", OK, served+"; in DNS as "+ref.Endpoint+"."+ref.Component+"."+ref.Namespace, "")
}

func (x *Explanation) checkCards(ref beacon.Ref, kvs []KV) {
	var found []string
	own := matching(ref, kvs, KindModel, true)
	for _, kv := range own {
		e, err := Decode(kv.Key, kv.Value)
		if err != nil {
			x.add("model card", Fail, err.Error(), "frontends skip a card they cannot parse: restart the worker to write it again")
			continue
		}
		x.Models = append(x.Models, e.Model)
		found = append(found, e.Model+" ("+kv.Key+")")
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
	x.add("model card", Warn, "none under "+ModelsKeyPrefix(ref)+" nor on another endpoint of this instance",
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
