package registry

import (
	"testing"

	"github.com/beaconplane/beacon"
)

func TestDecodeVerdict(t *testing.T) {
	good := map[string]beacon.Health{
		`{"status":"failing","reason":"connection refused","since":"2026-01-02T03:04:05Z","checker":"n1"}`: {Status: beacon.HealthFailing, Reason: "connection refused", Checker: "n1"},
		`{"status":"passing","panic":true}`: {Status: beacon.HealthPassing},
		`{"status":"unknown","extra":1}`:    {Status: beacon.HealthUnknown},
	}
	for val, want := range good {
		h, err := decodeVerdict([]byte(val))
		h.Since = beacon.Health{}.Since
		if err != nil || h != want {
			t.Errorf("decodeVerdict(%s) = %+v, %v; want %+v", val, h, err, want)
		}
	}
	for _, val := range []string{``, `null`, `{"status":"ok"}`, `{}`, `{"status":"passing"} {}`, `[1]`, "{\"status\":\"passing\",\"reason\":\"\xff\"}", `{"status":7}`} {
		if _, err := decodeVerdict([]byte(val)); err == nil {
			t.Errorf("decodeVerdict(%q) accepted a value that is no verdict", val)
		}
	}
}

func TestClassifyKeys(t *testing.T) {
	r := &StoreRegistry{}
	r.ks, _ = beacon.NewKeyspace("/root")
	const inst = "/root/services/ns/c/e/00000000000000ab"
	for _, c := range []struct {
		key  string
		kind keyKind
		of   string
	}{
		{inst, instanceKey, inst},
		{inst + "/health", verdictKey, inst},
		{inst + "/report", reportKey, inst},
		{inst + "/other", instanceKey, inst + "/other"},                                       // not an instance: reported as such
		{"/root/services/ns/c/e/bad/report", instanceKey, "/root/services/ns/c/e/bad/report"}, // no instance's report
		{"/root/services/ns/c/e/bad/health", instanceKey, "/root/services/ns/c/e/bad/health"},
		{inst + "/health/report", instanceKey, inst + "/health/report"},
	} {
		kind, of := r.classify(c.key)
		if kind != c.kind || of != c.of {
			t.Errorf("classify(%q) = %v, %q; want %v, %q", c.key, kind, of, c.kind, c.of)
		}
	}
}
