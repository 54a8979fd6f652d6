package dynamo_test

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
)

// The values below are written as the Dynamo runtime writes them
// (../shared/reference/dynamo-discovery.md §1.2-1.3, §4.1): serde_json of
// DiscoveryInstance, tagged by "type", instance_id a JSON number, the key's
// instance ID in unpadded lower-case hex.

const (
	tcpValue = `{"type":"Endpoint","namespace":"dynamo","component":"backend","endpoint":"generate",` +
		`"instance_id":42,"transport":{"tcp":"10.0.0.5:9999/generate"},"device_type":null,"request_plane_codec":"msgpack"}`
	legacyNATSValue = `{"type":"Endpoint","namespace":"dynamo","component":"backend","endpoint":"generate",` +
		`"instance_id":42,"transport":{"nats_tcp":"dynamo.backend.generate"}}`
	modelValue = `{"type":"Model","namespace":"dynamo","component":"backend","endpoint":"generate","instance_id":42,` +
		`"card_json":{"display_name":"Qwen/Qwen3-0.6B","slug":"qwen--qwen3-0-6b","context_length":40960},"model_suffix":null}`
)

func endpointValue(ns, comp, ep, id, transport, extra string) string {
	return `{"type":"Endpoint","namespace":"` + ns + `","component":"` + comp + `","endpoint":"` + ep +
		`","instance_id":` + id + `,"transport":` + transport + extra + `}`
}

func TestDecodeGolden(t *testing.T) {
	md := func(id, target, key string, more ...string) map[string]string {
		m := map[string]string{dynamo.MetaInstanceID: id, dynamo.MetaTarget: target, dynamo.MetaKey: key}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	inst := func(ns, comp, ep, id, addr, tr string, m map[string]string) beacon.Instance {
		return beacon.Instance{Namespace: ns, Component: comp, Endpoint: ep, ID: id, Address: addr, Transport: tr,
			Status: beacon.StatusServing, Metadata: m}
	}
	const k42 = "v1/instances/dynamo/backend/generate/2a"
	for _, tc := range []struct {
		name, key, value string
		want             beacon.Instance
	}{
		{"tcp, newest fields", k42, tcpValue,
			inst("dynamo", "backend", "generate", "000000000000002a", "10.0.0.5:9999", "tcp",
				md("42", "10.0.0.5:9999/generate", k42, dynamo.MetaCodec, "msgpack"))},
		{"nats_tcp, legacy writer without the optional fields", k42, legacyNATSValue,
			inst("dynamo", "backend", "generate", "000000000000002a", "nats:///dynamo.backend.generate", "nats",
				md("42", "dynamo.backend.generate", k42))},
		{"http with port", k42, endpointValue("dynamo", "backend", "generate", "42", `{"http":"http://10.0.0.5:8888/v1/rpc/generate"}`, ""),
			inst("dynamo", "backend", "generate", "000000000000002a", "10.0.0.5:8888", "http",
				md("42", "http://10.0.0.5:8888/v1/rpc/generate", k42))},
		{"https without port", k42, endpointValue("dynamo", "backend", "generate", "42", `{"http":"https://w1.example/v1/rpc/generate"}`, ""),
			inst("dynamo", "backend", "generate", "000000000000002a", "w1.example:443", "https",
				md("42", "https://w1.example/v1/rpc/generate", k42))},
		{"http without port", k42, endpointValue("dynamo", "backend", "generate", "42", `{"http":"http://[fd00::5]/v1/rpc/generate"}`, ""),
			inst("dynamo", "backend", "generate", "000000000000002a", "[fd00::5]:80", "http",
				md("42", "http://[fd00::5]/v1/rpc/generate", k42))},
		{"tcp on IPv6, device type, unknown future fields ignored", k42,
			endpointValue("dynamo", "backend", "generate", "42", `{"tcp":"[fd00::5]:9999/generate"}`,
				`,"device_type":"Cuda","request_plane_codec":null,"topology":{"zone":"a"},"weight":3,"labels":["x"]`),
			inst("dynamo", "backend", "generate", "000000000000002a", "[fd00::5]:9999", "tcp",
				md("42", "[fd00::5]:9999/generate", k42, dynamo.MetaDeviceType, "Cuda"))},
		{"device type of another shape kept as JSON", k42,
			endpointValue("dynamo", "backend", "generate", "42", `{"tcp":"10.0.0.5:9999/generate"}`, `,"device_type": {"Cuda" : 0}`),
			inst("dynamo", "backend", "generate", "000000000000002a", "10.0.0.5:9999", "tcp",
				md("42", "10.0.0.5:9999/generate", k42, dynamo.MetaDeviceType, `{"Cuda":0}`))},
		{"padded id", "v1/instances/dynamo/backend/generate/000000000000002a", tcpValue,
			inst("dynamo", "backend", "generate", "000000000000002a", "10.0.0.5:9999", "tcp",
				md("42", "10.0.0.5:9999/generate", "v1/instances/dynamo/backend/generate/000000000000002a", dynamo.MetaCodec, "msgpack"))},
		{"a lease id as etcd gives it", "v1/instances/vllm-agg/backend/generate/694d98147d54be25",
			endpointValue("vllm-agg", "backend", "generate", "7587888160958627365", `{"tcp":"10.0.0.7:9999/generate"}`, ""),
			inst("vllm-agg", "backend", "generate", "694d98147d54be25", "10.0.0.7:9999", "tcp",
				md("7587888160958627365", "10.0.0.7:9999/generate", "v1/instances/vllm-agg/backend/generate/694d98147d54be25"))},
		{"largest id", "v1/instances/dynamo/backend/generate/ffffffffffffffff",
			endpointValue("dynamo", "backend", "generate", "18446744073709551615", `{"tcp":"10.0.0.5:9999/generate"}`, ""),
			inst("dynamo", "backend", "generate", "ffffffffffffffff", "10.0.0.5:9999", "tcp",
				md("18446744073709551615", "10.0.0.5:9999/generate", "v1/instances/dynamo/backend/generate/ffffffffffffffff"))},
		{"id zero (a CLI without lease)", "v1/instances/dynamo/backend/generate/0",
			endpointValue("dynamo", "backend", "generate", "0", `{"tcp":"10.0.0.5:9999/generate"}`, ""),
			inst("dynamo", "backend", "generate", "0000000000000000", "10.0.0.5:9999", "tcp",
				md("0", "10.0.0.5:9999/generate", "v1/instances/dynamo/backend/generate/0"))},
		{"Dynamo's names: underscores, nested namespace", "v1/instances/dynamo.tenant_1/vllm_worker/clear_kv_blocks/2a",
			endpointValue("dynamo.tenant_1", "vllm_worker", "clear_kv_blocks", "42", `{"tcp":"10.0.0.5:9999/clear_kv_blocks"}`, ""),
			inst("dynamo.tenant_1", "vllm_worker", "clear_kv_blocks", "000000000000002a", "10.0.0.5:9999", "tcp",
				md("42", "10.0.0.5:9999/clear_kv_blocks", "v1/instances/dynamo.tenant_1/vllm_worker/clear_kv_blocks/2a"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := dynamo.Decode(tc.key, []byte(tc.value))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if e.Parsed.Kind != dynamo.KindEndpoint || e.Key != tc.key || !e.Instance.Equal(tc.want) {
				t.Fatalf("Decode = %+v\nwant %+v", e.Instance, tc.want)
			}
			if e.Parsed.Ref() != e.Instance.Ref() {
				t.Fatalf("key ref %v, instance ref %v", e.Parsed.Ref(), e.Instance.Ref())
			}
		})
	}
}

func TestDecodeModelCards(t *testing.T) {
	for _, tc := range []struct{ key, value, model, suffix string }{
		{"v1/mdc/dynamo/backend/generate/2a", modelValue, "Qwen/Qwen3-0.6B", ""},
		{"v1/mdc/dynamo/backend/generate/2a/my-lora",
			`{"type":"Model","namespace":"dynamo","component":"backend","endpoint":"generate","instance_id":42,` +
				`"card_json":{"display_name":"my-lora","runtime_config":{"taints":[]}},"model_suffix":"my-lora","newer":1}`,
			"my-lora", "my-lora"},
	} {
		e, err := dynamo.Decode(tc.key, []byte(tc.value))
		if err != nil {
			t.Fatalf("Decode(%s): %v", tc.key, err)
		}
		if e.Parsed.Kind != dynamo.KindModel || e.Model != tc.model || e.Parsed.Suffix != tc.suffix ||
			e.Parsed.Ref() != (beacon.Ref{Namespace: "dynamo", Component: "backend", Endpoint: "generate", ID: "000000000000002a"}) {
			t.Fatalf("Decode(%s) = %+v", tc.key, e)
		}
	}
}

// TestDecodeMalformed pins that every entry Beacon cannot serve is an
// *EntryError naming the key and what was wrong.
func TestDecodeMalformed(t *testing.T) {
	const k = "v1/instances/dynamo/backend/generate/2a"
	const m = "v1/mdc/dynamo/backend/generate/2a"
	tcp := `{"tcp":"10.0.0.5:9999/generate"}`
	ep := func(id, transport string) string {
		return endpointValue("dynamo", "backend", "generate", id, transport, "")
	}
	for _, tc := range []struct{ name, key, value, says string }{
		{"not JSON", k, `garbage`, "not JSON"},
		{"empty value", k, ``, "not JSON"},
		{"JSON array", k, `[1,2]`, "not a JSON object"},
		{"truncated", k, tcpValue[:40], "not JSON"},
		{"trailing data", k, tcpValue + `{}`, "data after its JSON object"},
		{"invalid UTF-8", k, "{\"type\":\"Endpoint\xff\"}", "not JSON text"},
		{"no type", k, `{"namespace":"dynamo"}`, `no "type"`},
		{"type not a string", k, `{"type":1}`, `"type" is not a string`},
		{"type in other case", k, strings.Replace(tcpValue, `"type"`, `"Type"`, 1), `no "type"`},
		{"unknown type", k, strings.Replace(tcpValue, `"Endpoint"`, `"Gizmo"`, 1), `unknown type "Gizmo"`},
		{"Model in the instances bucket", k, modelValue, `type "Model", which does not belong under v1/instances/`},
		{"Endpoint in the cards bucket", m, tcpValue, `type "Endpoint", which does not belong under v1/mdc/`},
		{"EventChannel in the instances bucket", k, `{"type":"EventChannel","topic":"kv-events"}`, `type "EventChannel"`},
		{"field twice", k, strings.Replace(tcpValue, `"instance_id":42`, `"instance_id":42,"instance_id":43`, 1), `gives "instance_id" twice`},
		{"id above 2^64", "v1/instances/dynamo/backend/generate/10000000000000000", ep("18446744073709551616", tcp), "above 2^64-1"},
		{"value id above 2^64", k, ep("18446744073709551616", tcp), "instance_id 18446744073709551616 is above 2^64-1"},
		{"negative id", k, ep("-42", tcp), "negative"},
		{"fractional id", k, ep("42.0", tcp), "not a whole number"},
		{"exponent id", k, ep("4.2e1", tcp), "not a whole number"},
		{"id as a string", k, ep(`"42"`, tcp), "not a number"},
		{"null id", k, ep("null", tcp), `no "instance_id"`},
		{"value id disagrees with key", k, ep("43", tcp), "instance_id 43 is not the key's 2a (42)"},
		{"value namespace disagrees", k, endpointValue("other", "backend", "generate", "42", tcp, ""), `namespace "other" is not the key's "dynamo"`},
		{"no component", k, `{"type":"Endpoint","namespace":"dynamo","endpoint":"generate","instance_id":42,"transport":` + tcp + `}`, `no "component"`},
		{"too few segments", "v1/instances/dynamo/backend/generate", tcpValue, "has 3 segments"},
		{"too many segments", "v1/instances/dynamo/backend/generate/2a/health", tcpValue, "has 5 segments"},
		{"card with too many segments", "v1/mdc/dynamo/backend/generate/2a/lora/x", modelValue, "has 6 segments"},
		{"card with empty suffix", "v1/mdc/dynamo/backend/generate/2a/", modelValue, "empty model suffix"},
		{"upper-case hex", "v1/instances/dynamo/backend/generate/2A", tcpValue, "not lower-case hex"},
		{"0x id", "v1/instances/dynamo/backend/generate/0x2a", tcpValue, "not lower-case hex"},
		{"empty id", "v1/instances/dynamo/backend/generate/", tcpValue, "instance_id is empty"},
		{"upper-case name", "v1/instances/Dynamo/backend/generate/2a", tcpValue, `invalid namespace "Dynamo"`},
		{"empty namespace label", "v1/instances/a..b/backend/generate/2a", tcpValue, `invalid namespace "a..b"`},
		{"dot in component", "v1/instances/dynamo/back.end/generate/2a", tcpValue, `invalid component "back.end"`},
		{"outside the buckets", "/services/dynamo/backend/generate/2a", tcpValue, "outside Dynamo's buckets"},
		{"no transport", k, `{"type":"Endpoint","namespace":"dynamo","component":"backend","endpoint":"generate","instance_id":42}`, `no "transport"`},
		{"unknown transport", k, ep("42", `{"zmq":"tcp://10.0.0.5:5555"}`), `transport "zmq" is unknown`},
		{"two transports", k, ep("42", `{"tcp":"10.0.0.5:9999/g","http":"http://10.0.0.5:8888/"}`), "has 2 members"},
		{"transport not a string", k, ep("42", `{"tcp":{"host":"10.0.0.5"}}`), `transport "tcp" is not a string`},
		{"tcp without port", k, ep("42", `{"tcp":"10.0.0.5/generate"}`), "not host:port/path"},
		{"tcp port 0", k, ep("42", `{"tcp":"10.0.0.5:0/generate"}`), "no port in 1-65535"},
		{"http of another scheme", k, ep("42", `{"http":"ftp://10.0.0.5/x"}`), "not an http:// or https:// URL"},
		{"empty subject", k, ep("42", `{"nats_tcp":""}`), `transport "nats_tcp" is empty`},
		{"subject with a space", k, ep("42", `{"nats_tcp":"a b"}`), "address"},
		{"card without card_json", m, `{"type":"Model","namespace":"dynamo","component":"backend","endpoint":"generate","instance_id":42}`, `no "card_json"`},
		{"card without display_name", m, strings.Replace(modelValue, `"display_name"`, `"name"`, 1), `card_json: value has no "display_name"`},
		{"display_name with a comma", m, strings.Replace(modelValue, `Qwen/Qwen3-0.6B`, `a,b`, 1), "holds a comma"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dynamo.Decode(tc.key, []byte(tc.value))
			var ee *dynamo.EntryError
			if !errors.As(err, &ee) || !errors.Is(err, dynamo.ErrMalformed) {
				t.Fatalf("Decode = %v, want an *EntryError matching ErrMalformed", err)
			}
			if ee.Key != tc.key || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Decode = %v: want the key %q and %q", err, tc.key, tc.says)
			}
		})
	}
}

func TestDecodeOtherBuckets(t *testing.T) {
	for _, key := range []string{
		"v1/event_channels/namespace/dynamo/component/backend/topic/kv-events/2a",
		"v1/event_sources/namespace/dynamo/topic/frontend-model-admission/2a",
		"v1/claims/session/abc",
		"v1/instances", // the bucket's name, no entry
		"v1/mdcx/dynamo/backend/generate/2a",
	} {
		if _, err := dynamo.Decode(key, []byte(`{"type":"EventChannel"}`)); !errors.Is(err, dynamo.ErrNotServed) {
			t.Errorf("Decode(%s) = %v, want ErrNotServed", key, err)
		}
	}
}

func TestKeyRoundTrip(t *testing.T) {
	ref := beacon.Ref{Namespace: "dynamo", Component: "backend", Endpoint: "generate", ID: "000000000000002a"}
	if got := dynamo.InstanceKey(ref); got != "v1/instances/dynamo/backend/generate/2a" {
		t.Fatalf("InstanceKey = %q", got)
	}
	if got := dynamo.ModelsKeyPrefix(ref); got != "v1/mdc/dynamo/backend/generate/2a/" {
		t.Fatalf("ModelsKeyPrefix = %q", got)
	}
	k, err := dynamo.ParseKey("v1/mdc/dynamo/backend/generate/002a/lora")
	if err != nil || k.String() != "v1/mdc/dynamo/backend/generate/2a/lora" || k.Ref() != ref {
		t.Fatalf("ParseKey = %+v (%s), %v", k, k, err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []struct{ key, value string }{
		{"v1/instances/dynamo/backend/generate/2a", tcpValue},
		{"v1/instances/dynamo/backend/generate/2a", legacyNATSValue},
		{"v1/mdc/dynamo/backend/generate/2a", modelValue},
		{"v1/instances/dynamo/backend/generate/2a", endpointValue("dynamo", "backend", "generate", "42", `{"http":"https://h:1/x"}`, `,"x":[]`)},
		{"v1/instances/a/b/c/ffffffffffffffff", `{"type":"Endpoint"}`},
		{"v1/claims/x", `{}`},
		{"v1/instances/a.b/c_d/-e/0", `[]`},
	} {
		f.Add(s.key, []byte(s.value))
	}
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		e, err := dynamo.Decode(key, value)
		if err != nil {
			var ee *dynamo.EntryError
			if !errors.Is(err, dynamo.ErrNotServed) && (!errors.As(err, &ee) || ee.Key != key) {
				t.Fatalf("Decode(%q) = %v: neither ErrNotServed nor an *EntryError with the key", key, err)
			}
			return
		}
		if e.Key != key {
			t.Fatalf("Decode(%q).Key = %q", key, e.Key)
		}
		if k, err := dynamo.ParseKey(key); err != nil || k != e.Parsed {
			t.Fatalf("ParseKey(%q) = %+v, %v; Decode parsed %+v", key, k, err, e.Parsed)
		}
		if e.Parsed.Kind == dynamo.KindModel {
			return
		}
		// Every instance decoded is one Beacon serves: read names, a
		// valid address, its ref the key's, the original ID kept.
		if err := e.Instance.ValidateRead(1 << 30); err != nil {
			t.Fatalf("Decode(%q) gave an instance that does not validate: %v", key, err)
		}
		if e.Instance.Ref() != e.Parsed.Ref() || e.Instance.Metadata[dynamo.MetaKey] != key ||
			e.Instance.Metadata[dynamo.MetaInstanceID] == "" || !maps.Equal(e.Instance.Clone().Metadata, e.Instance.Metadata) {
			t.Fatalf("Decode(%q) = %+v", key, e.Instance)
		}
	})
}

// TestDecodeShortensWholeCharacters: a huge value quoted in an error is cut
// before a character that straddles the limit, never inside it (which %q
// would print as a stray \x byte).
func TestDecodeShortensWholeCharacters(t *testing.T) {
	typ := strings.Repeat("a", 199) + "é" + strings.Repeat("b", 10)
	_, err := dynamo.Decode("v1/instances/dynamo/backend/generate/2a", []byte(`{"type":"`+typ+`"}`))
	if err == nil {
		t.Fatal("Decode of an unknown type succeeded")
	}
	want := `unknown type "` + strings.Repeat("a", 199) + `…(211 bytes)"`
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("Decode = %v, want %s", err, want)
	}
}
