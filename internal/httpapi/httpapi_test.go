package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

func TestParseQuery(t *testing.T) {
	many := make([]string, MaxQueryParams+1)
	for i := range many {
		many[i] = fmt.Sprintf("p%d=1", i)
	}
	// More than Go's own limit of 10,000: url.Values from r.URL.Query()
	// would be empty, silently dropping a filter.
	huge := strings.Repeat("x=1&", 10_001) + "namespace=prod"
	for _, tt := range []struct {
		raw, want string // want: "" for success, else in the error
	}{
		{"", ""},
		{"namespace=prod&status=serving", ""},
		{"namespace=", ""},
		{"namespace=a&namespace=b", "given 2 times"},
		{"a=%zz", "malformed"},
		{"a=1;b=2", "malformed"},
		{strings.Join(many[:MaxQueryParams], "&"), ""},
		{strings.Join(many, "&"), "too many"},
		{huge, "too many"},
	} {
		_, err := ParseQuery(tt.raw)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("ParseQuery(%.40q) = %v, want %q", tt.raw, err, tt.want)
		}
	}
}

func TestQueryRefusesUnknown(t *testing.T) {
	r := httptest.NewRequest("GET", "/v1/x?namespace=a&bogus=1", nil)
	if _, err := Query(r, "namespace"); err == nil || !strings.Contains(err.Error(), `unknown query parameter "bogus"`) {
		t.Fatalf("Query = %v", err)
	}
	if q, err := Query(r, "namespace", "bogus"); err != nil || q["namespace"] != "a" || q["bogus"] != "1" {
		t.Fatalf("Query = %v, %v", q, err)
	}
	r = httptest.NewRequest("GET", "/healthz?x", nil)
	if _, err := Query(r); err == nil || !strings.Contains(err.Error(), "takes none") {
		t.Fatalf("Query with no parameters allowed = %v", err)
	}
	// An empty value is refused, not read as "no filter".
	for _, q := range []string{"namespace=", "namespace", "namespace=&x=1", "x=1&namespace"} {
		r = httptest.NewRequest("GET", "/v1/x?"+q, nil)
		if _, err := Query(r, "namespace", "x"); err == nil || !strings.Contains(err.Error(), `query parameter "namespace" is empty`) {
			t.Errorf("Query(%q) = %v, want the empty namespace refused", q, err)
		}
	}
}

// FuzzParseQuery: ParseQuery never panics, and when it accepts a query it
// kept every parameter of it, once.
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"", "a=1", "a=1&a=2", "a=%zz", "a;b", "&&", "a", "=1", "a=1&b=%20"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := ParseQuery(raw)
		if err != nil {
			return
		}
		want := 0
		for _, part := range strings.Split(raw, "&") {
			if part == "" {
				continue
			}
			want++
			k, _, _ := strings.Cut(part, "=")
			key, err := url.QueryUnescape(k)
			if err != nil {
				t.Fatalf("accepted %q with an undecodable key %q", raw, k)
			}
			if len(v[key]) != 1 {
				t.Fatalf("accepted %q but parameter %q has %d values", raw, key, len(v[key]))
			}
		}
		if len(v) != want {
			t.Fatalf("accepted %q: %d parameters, want %d", raw, len(v), want)
		}
	})
}

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json": true, "application/JSON": true, "Application/Json; charset=UTF-8": true,
		"application/json;charset=utf-8": true, "application/json; charset=latin1": false,
		"text/plain": false, "application/jsonx": false, "application/x-www-form-urlencoded": false, "": false,
	} {
		if got := IsJSON(ct); got != want {
			t.Errorf("IsJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}

// rawText has its own syntax (as a TTL has): anything goes, but keys
// are still not given twice.
type rawText struct{}

func (*rawText) UnmarshalJSON([]byte) error { return nil }

type embedded struct {
	Inner int `json:"inner"`
}

func TestDecodeJSON(t *testing.T) {
	for _, tt := range []struct {
		ct, body string
		code     int
		want     string
	}{
		{"application/json", `{"a":1}`, 0, ""},
		{"", `{"a":1}`, 0, ""},
		{"APPLICATION/JSON", `{"a":1}`, 0, ""},
		{"text/plain", `{"a":1}`, 415, "Content-Type"},
		{"application/json", ``, 400, "empty body"},
		{"application/json", `{"b":1}`, 400, "unknown field"},
		{"application/json", `{"a":1} {}`, 400, "more than one JSON value"},
		{"application/json", `{"a":"` + strings.Repeat("x", 200) + `"}`, 413, "larger than"},
		{"application/json", `{"a":`, 400, "malformed"},
		// What encoding/json accepts silently: duplicates (the last
		// wins) and field names in another letter case.
		{"application/json", `{"a":1,"a":2}`, 400, `key "a" is given twice`},
		{"application/json", `{"a":1,"\u0061":2}`, 400, `key "a" is given twice`},
		{"application/json", `{"a":{"x":1,"y":{"z":1,"z":2}}}`, 400, `key "a.y.z" is given twice`},
		{"application/json", `{"a":[{"x":1},{"x":1,"x":1}]}`, 400, `key "a[1].x" is given twice`},
		{"application/json", `{"A":1}`, 400, `unknown field "A": field names are case-sensitive: did you mean "a"?`},
		{"application/json", `{"a":{"x":1,"X":2}}`, 0, ""},
		{"application/json", `{"m":{"k":"1","K":"2"}}`, 0, ""},
		{"application/json", `{"m":{"k":"1","k":"2"}}`, 400, `key "m.k" is given twice`},
		{"application/json", `{"t":"5s","M":{}}`, 400, `unknown field "M"`},
		{"application/json", `{"t":{"x":1,"x":2}}`, 400, `key "t.x" is given twice`},
		{"application/json", `{"Inner":1}`, 400, `did you mean "inner"?`},
		{"application/json", `{"inner":1,"p":{"k":"1","k":"1"}}`, 400, `key "p.k" is given twice`},
		// What encoding/json takes as the zero value: null.
		{"application/json", `{"a":null}`, 400, `"a" is null: null is not a value here: give one, or leave the field out`},
		{"application/json", `{"m":{"k":null}}`, 400, `"m.k" is null`},
		{"application/json", `{"p":null}`, 400, `"p" is null`},
		{"application/json", `{"a":[1,null]}`, 400, `"a[1]" is null`},
		{"application/json", `null`, 400, "the body is null: send a JSON object"},
		{"application/json", `{"a":"null"}`, 0, ""},
		// Another JSON type than an object: said so, not with the Go
		// type encoding/json names ("struct { A interface {} …").
		{"application/json", `[]`, 400, "the body must be a JSON object, not an array"},
		{"application/json", `"x"`, 400, "the body must be a JSON object, not a string"},
		{"application/json", `3`, 400, "the body must be a JSON object, not a number"},
		{"application/json", `true`, 400, "the body must be a JSON object, not a bool"},
		// Bodies that are not JSON text, named.
		{"application/json", "\x1f\x8b\x08\x00\x00\x00", 400, "the body is gzip-compressed"},
		{"application/json", "\x28\xb5\x2f\xfd\x00", 400, "the body is zstd-compressed"},
		{"application/json", "\xef\xbb\xbf{\"a\":1}", 400, "starts with a UTF-8 byte order mark (ef bb bf)"},
		{"application/json", "\xff\xfe{\x00}\x00", 400, "UTF-16 byte order mark"},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", strings.NewReader(tt.body))
		if tt.ct != "" {
			r.Header.Set("Content-Type", tt.ct)
		}
		var v struct {
			A any               `json:"a"`
			M map[string]string `json:"m"`
			T rawText           `json:"t"`
			embedded
			P *map[string]string `json:"p"`
		}
		ok := DecodeJSON(w, r, &v, 100)
		if tt.code == 0 {
			if !ok {
				t.Errorf("%q %q: refused: %s", tt.ct, tt.body, w.Body)
			}
			continue
		}
		var e Error
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if ok || w.Code != tt.code || e.Code != CodeInvalidArgument || !strings.Contains(e.Message, tt.want) {
			t.Errorf("%q %.20q: %d %s, want %d %q", tt.ct, tt.body, w.Code, w.Body, tt.code, tt.want)
		}
	}
}

// A compressed body is refused by its Content-Encoding before it is read
// (it was answered "must be valid UTF-8"); identity is no compression.
func TestDecodeJSONContentEncoding(t *testing.T) {
	for enc, code := range map[string]int{"gzip": 415, "br": 415, "gzip, identity": 415, "identity": 0, "IDENTITY": 0} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", strings.NewReader(`{"a":1}`))
		r.Header.Set("Content-Encoding", enc)
		var v struct {
			A int `json:"a"`
		}
		ok := DecodeJSON(w, r, &v, 100)
		if code == 0 {
			if !ok {
				t.Errorf("Content-Encoding %q: refused: %s", enc, w.Body)
			}
			continue
		}
		if ok || w.Code != code || !strings.Contains(w.Body.String(), "compressed bodies are not accepted: send the JSON uncompressed") {
			t.Errorf("Content-Encoding %q: %d %s", enc, w.Code, w.Body)
		}
	}
}

func TestRefuseRepeatedHeaders(t *testing.T) {
	h := RefuseRepeatedHeaders(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	for _, tc := range []struct {
		hdr  [][2]string
		code int
	}{
		{[][2]string{{"Authorization", "Basic a"}}, 204},
		{[][2]string{{"Authorization", "Basic a"}, {"Authorization", "Bearer b"}}, 400},
		{[][2]string{{"Content-Type", "application/json"}, {"Content-Type", "text/plain"}}, 400},
		{[][2]string{{"Accept", "a/b"}, {"Accept", "c/d"}}, 204}, // a list header: repeats are its syntax
	} {
		r := httptest.NewRequest("GET", "/", nil)
		for _, kv := range tc.hdr {
			r.Header.Add(kv[0], kv[1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code || (tc.code == 400 && !strings.Contains(w.Body.String(), "is given 2 times: send it once")) {
			t.Errorf("%v: %d %s", tc.hdr, w.Code, w.Body)
		}
	}
}

func TestAccepts(t *testing.T) {
	for accept, want := range map[string]bool{
		"": true, "*/*": true, "text/*": true, "text/event-stream": true, "TEXT/Event-Stream": true,
		"application/json": false, "application/json, text/event-stream;q=0.5": true,
		"text/event-stream;q=0": false, "text/html,application/xhtml+xml,*/*;q=0.8": true,
		"application/json;q=1, */*;q=0": false, "garbage;;": true,
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		if got := Accepts(r, "text/event-stream"); got != want {
			t.Errorf("Accept %q: Accepts(text/event-stream) = %v, want %v", accept, got, want)
		}
	}
}

func TestMuxAnswersJSON(t *testing.T) {
	m := NewMux()
	m.NotFound = "see the docs"
	m.HandleFunc("GET /a/{id}", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.PathValue("id")) })
	m.HandleFunc("DELETE /a/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })
	m.HandleFunc("GET /a/{id}/b/{x}", func(w http.ResponseWriter, _ *http.Request) {})
	srv := httptest.NewServer(m)
	defer srv.Close()
	noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tt := range []struct {
		method, path string
		code         int
		allow, code2 string
		says         string
	}{
		{"GET", "/a/1", 200, "", "", ""},
		{"PUT", "/a/1", 405, "GET, HEAD, DELETE", CodeMethodNotAllowed, "on /a/1;"},
		{"GET", "/b", 404, "", CodeNotFound, ""},
		{"GET", "/a", 404, "", CodeNotFound, ""},
		// Paths http.ServeMux would redirect (307, no body) get JSON.
		{"POST", "//a/1", 400, "", CodeInvalidArgument, "request /a/1"},
		{"DELETE", "/a/./1", 400, "", CodeInvalidArgument, "request /a/1"},
		{"GET", "/a/x/../1/", 400, "", CodeInvalidArgument, "request /a/1/"},
		// An escaped slash is one segment: the message shows it as sent,
		// not as a path that looks routable.
		{"GET", "/a/1%2fb/2", 404, "", CodeNotFound, "no route GET /a/1%2fb/2"},
		// %2F.. is within a segment: no segment is "..", and no
		// suggestion built from the decoded path.
		{"GET", "/a/1/%2F..", 404, "", CodeNotFound, "no route GET /a/1/%2F.."},
		{"GET", "/a/1/b/%2F..", 200, "", "", ""}, // {x} is "/.."
	} {
		req, _ := http.NewRequest(tt.method, srv.URL+tt.path, nil)
		resp, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || resp.Header.Get("Allow") != tt.allow {
			t.Errorf("%s %s: %d Allow %q, want %d %q", tt.method, tt.path, resp.StatusCode, resp.Header.Get("Allow"), tt.code, tt.allow)
		}
		if tt.code2 != "" {
			var e Error
			if err := json.Unmarshal(b, &e); err != nil || e.Code != tt.code2 || resp.Header.Get("Content-Type") != "application/json" ||
				!strings.Contains(e.Message, tt.says) {
				t.Errorf("%s %s: body %s", tt.method, tt.path, b)
			}
		}
	}
	if got := m.Patterns(); len(got) != 3 || got[0] != "GET /a/{id}" {
		t.Errorf("Patterns = %v", got)
	}
	if !m.Serves("GET", "/a/{id}") || m.Serves("POST", "/a/{id}") || m.Serves("GET", "/b") {
		t.Error("Serves is wrong")
	}
}

// TestMuxQueries: with Queries, a route's query is checked against its
// rule before the handler runs, whatever the handler does.
func TestMuxQueries(t *testing.T) {
	m := NewMux()
	ran := 0
	m.HandleFunc("GET /a", func(http.ResponseWriter, *http.Request) { ran++ })
	m.HandleFunc("GET /free/", func(http.ResponseWriter, *http.Request) { ran++ })
	m.Queries = func(pattern string) (QueryRule, bool) {
		if pattern == "GET /a" {
			return QueryRule{Params: []string{"x", "tag"}, Repeatable: []string{"tag"}}, true
		}
		return QueryRule{}, false
	}
	for q, want := range map[string]int{
		"": 200, "x=1": 200, "tag=a&tag=b": 200, "x=1&x=2": 400, "y=1": 400, "%zz": 400,
		"x=": 400, "x": 400, "tag=a&tag=": 400,
	} {
		w := httptest.NewRecorder()
		m.ServeHTTP(w, httptest.NewRequest("GET", "/a?"+q, nil))
		if w.Code != want {
			t.Errorf("GET /a?%s: %d, want %d: %s", q, w.Code, want, w.Body)
		}
	}
	w := httptest.NewRecorder()
	m.ServeHTTP(w, httptest.NewRequest("GET", "/free/x?anything=1", nil))
	if w.Code != 200 {
		t.Errorf("a route without a rule: %d", w.Code)
	}
	if ran != 4 {
		t.Errorf("handlers ran %d times, want 4 (only for accepted queries)", ran)
	}
}

// FuzzDecodeJSON: DecodeJSON never panics; what it accepts decodes as
// encoding/json decodes it, and has no key given twice in any object.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":1,"a":2}`, `{"A":1}`, `{"m":{"k":"1","k":"2"}}`, `{"a":[{"x":1},{"x":1,"x":2}]}`,
		`{"a":{"\u0078":1,"x":2}}`, `{"t":{"x":1}}`, `{"inner":1}`, `[]`, `{"a":[[[[[]]]]]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		type target struct {
			A any               `json:"a"`
			M map[string]string `json:"m"`
			T rawText           `json:"t"`
			embedded
		}
		var v target
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		if !DecodeJSON(w, r, &v, 1<<16) {
			if w.Code != 400 && w.Code != 413 {
				t.Fatalf("%q refused with %d", body, w.Code)
			}
			return
		}
		var std target
		if err := json.Unmarshal([]byte(body), &std); err != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", body, err)
		}
		if dup := firstDuplicate(json.NewDecoder(strings.NewReader(body))); dup != "" {
			t.Fatalf("accepted %q with key %q given twice", body, dup)
		}
	})
}

// firstDuplicate returns a key given twice in one object of the value
// read from dec, or "".
func firstDuplicate(dec *json.Decoder) string {
	type frame struct {
		obj  bool
		keys map[string]bool
		key  bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if s, ok := tok.(string); ok && top != nil && top.obj && top.key {
			if top.keys[s] {
				return s
			}
			top.keys[s] = true
			top.key = false
			continue
		}
		if top != nil && top.obj {
			top.key = true // a value was read: a key comes next
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, keys: map[string]bool{}, key: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].obj {
				stack[len(stack)-1].key = true
			}
		}
	}
}
