package beacon

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValidateJSONText(t *testing.T) {
	for _, ok := range []string{
		`{"metadata":{"zone":"a"}}`,
		`{"k":"caf\u00e9 \ud83d\ude00 😀 \ufffd �"}`, // a pair, a real U+FFFD
		`{"k":"\\ud800"}`,                           // an escaped backslash, not an escape
		`{"k":"\"\\\/\b\f\n\r\t"}`,
		`[1, true, null, "x"]`,
		``,
	} {
		if err := ValidateJSONText([]byte(ok)); err != nil {
			t.Errorf("ValidateJSONText(%s) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"{\"k\":\"\xff\"}",
		"{\"k\xc3\":\"v\"}",
		`{"k":"\ud800"}`,
		`{"k":"\udc00"}`,
		`{"k":"\ud800\u0041"}`,
		`{"k":"\ud800x"}`,
		`{"k":"\uD83D"}`,
	} {
		err := ValidateJSONText([]byte(bad))
		if err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateJSONText(%q) = %v, want an invalid-argument error", bad, err)
		}
	}
}

// TestUnmarshalInstanceRefusesDamagedText: a stored value whose text would
// be rewritten to U+FFFD is refused, not silently changed.
func TestUnmarshalInstanceRefusesDamagedText(t *testing.T) {
	in := validInstance()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(b, []byte(`"zone":"a"`), []byte("\"zone\":\"a\xff\""), 1)
	if bytes.Equal(bad, b) {
		t.Fatalf("test instance has no zone metadata: %s", b)
	}
	if _, err := UnmarshalInstance(bad); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("UnmarshalInstance(invalid UTF-8) = %v", err)
	}
}

// FuzzValidateJSONText: text that passes decodes without loss — every
// U+FFFD in the decoded strings was in the input, literally or as \ufffd.
func FuzzValidateJSONText(f *testing.F) {
	for _, s := range []string{`{"a":"b"}`, `{"k":"\ud83d\ude00"}`, `{"k":"\ud800"}`, "{\"k\":\"\xff\"}", `["\ufffd","�"]`, `"\\u"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := ValidateJSONText(data)
		var v any
		if json.Unmarshal(data, &v) != nil || err != nil {
			return
		}
		got := countReplacement(v)
		lower := bytes.ToLower(data)
		want := bytes.Count(data, []byte("\uFFFD")) + bytes.Count(lower, []byte(`\ufffd`))
		// An escaped backslash before "ufffd" is not an escape; only
		// count an upper bound.
		if got > want {
			t.Fatalf("%q passed but decodes with %d U+FFFD (input has %d)", data, got, want)
		}
	})
}

func countReplacement(v any) int {
	n := 0
	switch x := v.(type) {
	case string:
		n += strings.Count(x, string(utf8.RuneError))
	case []any:
		for _, e := range x {
			n += countReplacement(e)
		}
	case map[string]any:
		for k, e := range x {
			n += strings.Count(k, string(utf8.RuneError)) + countReplacement(e)
		}
	}
	return n
}

// FuzzValidateMetadata: metadata that passes is valid UTF-8 within the
// limit, and survives a JSON round trip unchanged.
func FuzzValidateMetadata(f *testing.F) {
	f.Add("zone", "a")
	f.Add("k\xff", "v")
	f.Add("k", "v\xc3")
	f.Add("", "x")
	f.Fuzz(func(t *testing.T, k, v string) {
		md := map[string]string{k: v}
		if ValidateMetadata(md, DefaultMaxMetadataSize) != nil {
			return
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) || MetadataSize(md) > DefaultMaxMetadataSize {
			t.Fatalf("accepted %q=%q", k, v)
		}
		b, err := json.Marshal(md)
		if err != nil {
			t.Fatal(err)
		}
		if err := ValidateJSONText(b); err != nil {
			t.Fatalf("accepted metadata encodes to refused JSON %s: %v", b, err)
		}
		var back map[string]string
		if err := json.Unmarshal(b, &back); err != nil || back[k] != v || len(back) != 1 {
			t.Fatalf("round trip of %q=%q: %v, %v", k, v, back, err)
		}
	})
}
