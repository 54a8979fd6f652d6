package beacon

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseCheck(t *testing.T) {
	for spec, want := range map[string]Check{
		"grpc":            {Kind: CheckGRPC},
		"grpc:api.v1.Api": {Kind: CheckGRPC, Service: "api.v1.Api"},
		"http:/healthz":   {Kind: CheckHTTP, Path: "/healthz"},
		"http:/a?b=c":     {Kind: CheckHTTP, Path: "/a?b=c"},
		"tcp":             {Kind: CheckTCP},
		"ttl:30s":         {Kind: CheckTTL, TTL: 30 * time.Second},
	} {
		got, err := ParseCheck(spec)
		if err != nil || got != want {
			t.Errorf("ParseCheck(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
		if got.String() != spec {
			t.Errorf("ParseCheck(%q).String() = %q", spec, got.String())
		}
	}
}

// TestParseCheckRefuses: each bad declaration is refused with ErrInvalidCheck
// and a message that says what to write instead.
func TestParseCheckRefuses(t *testing.T) {
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
		"grpc:a\xffb":                        "printable UTF-8",
		"http:/\xc3":                         "printable UTF-8",
	} {
		_, err := ParseCheck(spec)
		if !errors.Is(err, ErrInvalidCheck) || !strings.Contains(err.Error(), says) {
			t.Errorf("ParseCheck(%q) = %v; want ErrInvalidCheck saying %q", spec, err, says)
		}
	}
}

// TestValidateTiming: intervals of 0 stand for the default; too short, too
// long, timeouts beyond the interval and thresholds of 0 or over the bound
// are refused, each naming the bound.
func TestValidateTiming(t *testing.T) {
	ok := []Check{
		{Kind: CheckTCP},
		{Kind: CheckTCP, Interval: MinCheckInterval, Timeout: MinCheckTimeout},
		{Kind: CheckTCP, Interval: MaxCheckInterval, Rise: MaxCheckThreshold, Fall: MaxCheckThreshold},
		{Kind: CheckTCP, Interval: time.Second}, // the default timeout shrinks to the interval
	}
	for _, c := range ok {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for says, c := range map[string]Check{
		"interval 1ms":        {Kind: CheckTCP, Interval: time.Millisecond},
		"interval 8760h0m0s":  {Kind: CheckTCP, Interval: 365 * 24 * time.Hour},
		"interval -1s":        {Kind: CheckTCP, Interval: -time.Second},
		"timeout 2s must be":  {Kind: CheckTCP, Interval: time.Second, Timeout: 2 * time.Second},
		"timeout 1ms must be": {Kind: CheckTCP, Timeout: time.Millisecond},
		"rise -1":             {Kind: CheckTCP, Rise: -1},
		"rise 101":            {Kind: CheckTCP, Rise: 101},
		"fall -3":             {Kind: CheckTCP, Fall: -3},
		"fall 1000":           {Kind: CheckTCP, Fall: 1000},
		"kind must be":        {Kind: "udp"},
	} {
		err := c.Validate()
		if !errors.Is(err, ErrInvalidCheck) || !strings.Contains(err.Error(), says) {
			t.Errorf("%+v: %v; want ErrInvalidCheck saying %q", c, err, says)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	got := Check{Kind: CheckTCP}.WithDefaults()
	want := Check{Kind: CheckTCP, Interval: DefaultCheckInterval, Timeout: DefaultCheckTimeout, Rise: DefaultCheckRise, Fall: DefaultCheckFall}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got := (Check{Kind: CheckTCP, Interval: time.Second}).WithDefaults(); got.Timeout != time.Second {
		t.Fatalf("the default timeout %s exceeds the interval", got.Timeout)
	}
}

// TestCheckJSONRefusesZeroes: a field sent as zero is refused, naming
// it, where it was read as the field's default without a word (while 1ns
// and 101 were refused); left out, a field still takes its default.
func TestCheckJSONRefusesZeroes(t *testing.T) {
	for _, body := range []string{
		`{"kind":"http","path":"/h","interval":"0s"}`,
		`{"kind":"http","path":"/h","timeout":"0ms"}`,
		`{"kind":"ttl","ttl":"0s"}`,
		`{"kind":"tcp","rise":0}`,
		`{"kind":"tcp","fall":0}`,
		`{"kind":"http","path":"/h","interval":""}`,
		`{"kind":"http","path":"/h","timeout":""}`,
	} {
		var c Check
		err := json.Unmarshal([]byte(body), &c)
		if !errors.Is(err, ErrInvalidCheck) || !strings.Contains(err.Error(), "leave") {
			t.Errorf("%s: %v, want it refused, saying to leave the field out", body, err)
		}
	}
	var c Check
	if err := json.Unmarshal([]byte(`{"kind":"tcp","rise":3}`), &c); err != nil || c != (Check{Kind: CheckTCP, Rise: 3}) {
		t.Fatalf("rise 3: %+v, %v", c, err)
	}
}

// TestWrittenCheckHasNoFieldItsKindIgnores: a writer may not declare a
// field the check's kind does not read (a TCP check's path was stored and
// meant nothing); a reader takes what an older writer stored.
func TestWrittenCheckHasNoFieldItsKindIgnores(t *testing.T) {
	for name, c := range map[string]Check{
		"tcp with a path":      {Kind: CheckTCP, Path: "/x"},
		"http with service":    {Kind: CheckHTTP, Path: "/h", Service: "s"},
		"grpc with a ttl":      {Kind: CheckGRPC, TTL: time.Minute},
		"ttl with a path":      {Kind: CheckTTL, TTL: time.Minute, Path: "/x"},
		"ttl with a timeout":   {Kind: CheckTTL, TTL: time.Minute, Timeout: time.Second},
		"ttl with an interval": {Kind: CheckTTL, TTL: time.Minute, Interval: time.Second},
		"ttl with a rise":      {Kind: CheckTTL, TTL: time.Minute, Rise: 2},
		"ttl with a fall":      {Kind: CheckTTL, TTL: time.Minute, Fall: 3},
	} {
		in := validInstance()
		in.Check = &c
		if err := in.Validate(); !errors.Is(err, ErrInvalidCheck) {
			t.Errorf("%s: written: %v, want refused", name, err)
		}
		if err := in.ValidateRead(DefaultMaxMetadataSize); err != nil {
			t.Errorf("%s: read: %v, want taken", name, err)
		}
	}
}

// FuzzParse: Parse never panics; what it accepts validates, prints back to
// a spec that parses to the same check, and has no control characters.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"grpc", "grpc:svc", "http:/healthz", "tcp", "ttl:30s", "http:", "ttl:1h2m", "http:/\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		c, err := ParseCheck(spec)
		if err != nil {
			if !errors.Is(err, ErrInvalidCheck) {
				t.Fatalf("ParseCheck(%q): %v does not match ErrInvalidCheck", spec, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseCheck(%q) accepted %+v, which does not validate: %v", spec, c, err)
		}
		again, err := ParseCheck(c.String())
		if err != nil || again != c {
			t.Fatalf("ParseCheck(%q) = %+v; its String %q parses to %+v, %v", spec, c, c.String(), again, err)
		}
		if !printable(c.Path) || !printable(c.Service) {
			t.Fatalf("ParseCheck(%q) accepted control characters or invalid UTF-8", spec)
		}
		var stored Check // what a watcher reads back of the declaration
		if b, err := json.Marshal(c); err != nil || json.Unmarshal(b, &stored) != nil || stored != c {
			t.Fatalf("ParseCheck(%q) = %+v; stored as %s it reads back as %+v", spec, c, b, stored)
		}
	})
}
