package health

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for spec, want := range map[string]Check{
		"grpc":            {Kind: GRPC},
		"grpc:api.v1.Api": {Kind: GRPC, Service: "api.v1.Api"},
		"http:/healthz":   {Kind: HTTP, Path: "/healthz"},
		"http:/a?b=c":     {Kind: HTTP, Path: "/a?b=c"},
		"tcp":             {Kind: TCP},
		"ttl:30s":         {Kind: TTL, TTL: 30 * time.Second},
	} {
		got, err := Parse(spec)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
		if got.String() != spec {
			t.Errorf("Parse(%q).String() = %q", spec, got.String())
		}
	}
}

// TestParseRefuses: each bad declaration is refused with ErrInvalidCheck
// and a message that says what to write instead.
func TestParseRefuses(t *testing.T) {
	for spec, says := range map[string]string{
		"":                                   "grpc, http:/PATH, tcp or ttl:DURATION",
		"ping":                               "grpc, http:/PATH, tcp or ttl:DURATION",
		"GRPC":                               "grpc, http:/PATH, tcp or ttl:DURATION",
		"http":                               "http:/healthz",
		"http:healthz":                       "must start with /",
		"http:/a b":                          "no space",
		"http:/a\r\nX-Evil: 1":               "printable",
		"http:/" + strings.Repeat("a", 2000): "1024 bytes",
		"tcp:80":                             "takes no argument",
		"ttl":                                "ttl:30s",
		"ttl:0s":                             "1s..24h0m0s",
		"ttl:8760h":                          "1s..24h0m0s",
		"ttl:-1s":                            "1s..24h0m0s",
		"grpc:a\x00b":                        "printable",
	} {
		_, err := Parse(spec)
		if !errors.Is(err, ErrInvalidCheck) || !strings.Contains(err.Error(), says) {
			t.Errorf("Parse(%q) = %v; want ErrInvalidCheck saying %q", spec, err, says)
		}
	}
}

// TestValidateTiming: intervals of 0 stand for the default; too short, too
// long, timeouts beyond the interval and thresholds of 0 or over the bound
// are refused, each naming the bound.
func TestValidateTiming(t *testing.T) {
	ok := []Check{
		{Kind: TCP},
		{Kind: TCP, Interval: MinInterval, Timeout: MinTimeout},
		{Kind: TCP, Interval: MaxInterval, Rise: MaxThreshold, Fall: MaxThreshold},
		{Kind: TCP, Interval: time.Second}, // the default timeout shrinks to the interval
	}
	for _, c := range ok {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for says, c := range map[string]Check{
		"interval 1ms":        {Kind: TCP, Interval: time.Millisecond},
		"interval 8760h0m0s":  {Kind: TCP, Interval: 365 * 24 * time.Hour},
		"interval -1s":        {Kind: TCP, Interval: -time.Second},
		"timeout 2s must be":  {Kind: TCP, Interval: time.Second, Timeout: 2 * time.Second},
		"timeout 1ms must be": {Kind: TCP, Timeout: time.Millisecond},
		"rise -1":             {Kind: TCP, Rise: -1},
		"rise 101":            {Kind: TCP, Rise: 101},
		"fall -3":             {Kind: TCP, Fall: -3},
		"fall 1000":           {Kind: TCP, Fall: 1000},
		"kind must be":        {Kind: "udp"},
	} {
		err := c.Validate()
		if !errors.Is(err, ErrInvalidCheck) || !strings.Contains(err.Error(), says) {
			t.Errorf("%+v: %v; want ErrInvalidCheck saying %q", c, err, says)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	got := Check{Kind: TCP}.WithDefaults()
	want := Check{Kind: TCP, Interval: DefaultInterval, Timeout: DefaultTimeout, Rise: DefaultRise, Fall: DefaultFall}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got := (Check{Kind: TCP, Interval: time.Second}).WithDefaults(); got.Timeout != time.Second {
		t.Fatalf("the default timeout %s exceeds the interval", got.Timeout)
	}
}

// FuzzParse: Parse never panics; what it accepts validates, prints back to
// a spec that parses to the same check, and has no control characters.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"grpc", "grpc:svc", "http:/healthz", "tcp", "ttl:30s", "http:", "ttl:1h2m", "http:/\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		c, err := Parse(spec)
		if err != nil {
			if !errors.Is(err, ErrInvalidCheck) {
				t.Fatalf("Parse(%q): %v does not match ErrInvalidCheck", spec, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse(%q) accepted %+v, which does not validate: %v", spec, c, err)
		}
		again, err := Parse(c.String())
		if err != nil || again != c {
			t.Fatalf("Parse(%q) = %+v; its String %q parses to %+v, %v", spec, c, c.String(), again, err)
		}
		if !printable(c.Path) || !printable(c.Service) {
			t.Fatalf("Parse(%q) accepted control characters", spec)
		}
	})
}
