package registry_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

func TestParseTTL(t *testing.T) {
	good := map[string]time.Duration{"10s": 10 * time.Second, "10": 10 * time.Second, "1m30s": 90 * time.Second, "1h": time.Hour, "1": time.Second}
	for s, want := range good {
		got, err := registry.ParseTTL(s)
		if err != nil || got != want {
			t.Errorf("ParseTTL(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "0", "0s", "500ms", "-5s", "61m", "3601", "ten", "10x", "99999999999999999999"} {
		if _, err := registry.ParseTTL(s); !errors.Is(err, registry.ErrInvalidTTL) {
			t.Errorf("ParseTTL(%q): %v, want ErrInvalidTTL", s, err)
		}
	}
	// However absurd, a number or a duration out of range is refused
	// with the range, not as a negative duration or as "not a number".
	for _, s := range []string{"99999999999999999999", "-99999999999999999999", "9999999999h", "99999999999999999999s", "2562048h", "-2562048h"} {
		_, err := registry.ParseTTL(s)
		if !errors.Is(err, registry.ErrInvalidTTL) || !strings.Contains(err.Error(), "outside [1s, 1h0m0s]") || strings.Contains(err.Error(), "2562047h") {
			t.Errorf("ParseTTL(%q): %v, want it outside [1s, 1h0m0s]", s, err)
		}
	}
}

func TestParseTTLSeconds(t *testing.T) {
	good := map[string]time.Duration{"10": 10 * time.Second, "1.5": 1500 * time.Millisecond, "1e1": 10 * time.Second, "3600": time.Hour, "1": time.Second}
	for s, want := range good {
		got, err := registry.ParseTTLSeconds(s)
		if err != nil || got != want {
			t.Errorf("ParseTTLSeconds(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"1e308", "-1e308", "1e400", "-1e400", "1e-400", "0", "-0", "0.999", "3600.001", "9223372036.854775807", "1e19"} {
		_, err := registry.ParseTTLSeconds(s)
		if !errors.Is(err, registry.ErrInvalidTTL) || !strings.Contains(err.Error(), s+" seconds is outside [1s, 1h0m0s]") {
			t.Errorf("ParseTTLSeconds(%q): %v, want %s seconds outside [1s, 1h0m0s]", s, err, s)
		}
	}
	if _, err := registry.ParseTTLSeconds("ten"); !errors.Is(err, registry.ErrInvalidTTL) {
		t.Errorf("ParseTTLSeconds(ten): %v", err)
	}
}

func FuzzParseTTL(f *testing.F) {
	for _, s := range []string{"10s", "10", "1h", "0", "-1", "1e9", "5m0.5s", "9223372036854775807", "9999999999h", "1.5e308"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ttl, err := registry.ParseTTL(s)
		if err != nil {
			if !errors.Is(err, registry.ErrInvalidTTL) {
				t.Fatalf("ParseTTL(%q): error %v does not match ErrInvalidTTL", s, err)
			}
			return
		}
		if ttl < registry.MinLeaseTTL || ttl > registry.MaxLeaseTTL {
			t.Fatalf("ParseTTL(%q) = %v, outside the bounds", s, ttl)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	bad := map[string]registry.Config{
		"root without slash":      {Root: "beacon"},
		"root trailing slash":     {Root: "/beacon/"},
		"ttl too short":           {LeaseTTL: 100 * time.Millisecond},
		"ttl too long":            {LeaseTTL: 2 * time.Hour},
		"negative metadata":       {MaxMetadataSize: -1},
		"metadata no value holds": {MaxMetadataSize: store.MaxValueSize + 1},
		"negative retry":          {RetryMax: -time.Second},
		"negative drain":          {DrainGrace: -time.Second},
		"panic above 1":           {HealthPanicThreshold: 1.01},
		"panic not a number":      {HealthPanicThreshold: math.NaN()},
		"panic infinite":          {HealthPanicThreshold: math.Inf(1)},
	}
	for name, c := range bad {
		if err := c.Validate(); !errors.Is(err, registry.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
		if _, err := registry.New(newMemoryStore(t), c); !errors.Is(err, registry.ErrInvalidConfig) {
			t.Errorf("New with %s: %v", name, err)
		}
	}
	for _, ok := range []registry.Config{{}, {MaxMetadataSize: store.MaxValueSize}, {HealthPanicThreshold: 1}, {HealthPanicThreshold: -1}, {HealthPanicThreshold: math.Inf(-1)}} {
		if err := ok.Validate(); err != nil {
			t.Fatalf("Config %+v: %v", ok, err)
		}
	}
	if err := (registry.Config{HealthPanicThreshold: 2}).Validate(); err == nil || !strings.Contains(err.Error(), "HealthPanicThreshold 2 ") {
		t.Fatalf("a threshold above 1: %v, want an error naming the field", err)
	}
	if _, err := registry.New(nil, registry.Config{}); !errors.Is(err, registry.ErrInvalidConfig) {
		t.Fatalf("nil store: %v", err)
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv(registry.LeaseTTLEnv, "15s")
	c, err := registry.ConfigFromEnv()
	if err != nil || c.LeaseTTL != 15*time.Second {
		t.Fatalf("ConfigFromEnv = %+v, %v", c, err)
	}
	t.Setenv(registry.LeaseTTLEnv, "soon")
	if _, err := registry.ConfigFromEnv(); !errors.Is(err, registry.ErrInvalidTTL) {
		t.Fatalf("bad %s: %v", registry.LeaseTTLEnv, err)
	}
	t.Setenv(registry.LeaseTTLEnv, "")
	if c, err := registry.ConfigFromEnv(); err != nil || c.LeaseTTL != 0 {
		t.Fatalf("unset: %+v, %v", c, err)
	}
}
