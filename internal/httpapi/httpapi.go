// Package httpapi holds what every Beacon HTTP API shares, so that they
// answer alike: JSON bodies in one style (compact, one line, snake_case
// fields), errors as {"code","message"}, strict query parsing (an
// unparsable query, too many parameters, an unknown or repeated one is a
// 400, never silently ignored), strict JSON request bodies, and a router
// that answers unknown paths (404) and methods (405) with JSON errors and
// remembers the patterns it serves.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/beaconplane/beacon"
)

// Error codes of the {"code","message"} error bodies shared by the APIs.
const (
	CodeInvalidArgument  = "invalid_argument"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeUnavailable      = "unavailable"
	CodeInternal         = "internal"
)

// Error is the body of every error.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteJSON writes v as one line of compact JSON with the status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError writes an error body.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	WriteJSON(w, status, Error{Code: code, Message: strings.TrimSpace(msg)})
}

// MaxQueryParams is the most query parameters any route accepts: Beacon's
// routes take a handful, so more is refused (with 400) rather than parsed.
// Go's own parser silently drops a query of more than 10,000.
const MaxQueryParams = 32

// QueryError is a query that cannot be accepted; its message says why.
type QueryError struct{ msg string }

func (e *QueryError) Error() string { return e.msg }

// ParseQuery parses a raw query strictly: at most MaxQueryParams
// parameters, valid percent-encoding and no ';' separators, each name at
// most once. It never drops a parameter silently.
func ParseQuery(raw string) (url.Values, error) { return parseQuery(raw, nil, false) }

// parseQuery is ParseQuery; names in repeatable may be given more than
// once.
func parseQuery(raw string, repeatable []string, anyRepeats bool) (url.Values, error) {
	if raw == "" {
		return url.Values{}, nil
	}
	if n := strings.Count(raw, "&") + 1; n > MaxQueryParams {
		return nil, &QueryError{fmt.Sprintf("too many query parameters (%d; at most %d)", n, MaxQueryParams)}
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return nil, &QueryError{"malformed query: " + err.Error()}
	}
	for _, name := range sortedKeys(v) {
		if len(v[name]) > 1 && !anyRepeats && !slices.Contains(repeatable, name) {
			return nil, &QueryError{fmt.Sprintf("query parameter %q is given %d times: give it once", name, len(v[name]))}
		}
	}
	return v, nil
}

// QueryRule says what a route takes in its query.
type QueryRule struct {
	// Params are the parameters the route takes; any other is refused.
	Params []string
	// Repeatable are the parameters (among Params) that may be given more
	// than once.
	Repeatable []string
	// Open tolerates parameters not in Params (a page a browser loads,
	// whose links may carry others' parameters, utm_source and the like);
	// a query that cannot be parsed is still refused.
	Open bool
}

// check refuses a query the rule does not allow.
func (q QueryRule) check(r *http.Request) error {
	if q.Open {
		_, err := parseQuery(r.URL.RawQuery, nil, true)
		return err
	}
	v, err := parseQuery(r.URL.RawQuery, q.Repeatable, false)
	if err != nil {
		return err
	}
	for _, name := range sortedKeys(v) {
		if !slices.Contains(q.Params, name) {
			if len(q.Params) == 0 {
				return &QueryError{fmt.Sprintf("unknown query parameter %q: %s %s takes none", name, r.Method, r.URL.Path)}
			}
			return &QueryError{fmt.Sprintf("unknown query parameter %q: %s %s takes %s", name, r.Method, r.URL.Path, strings.Join(q.Params, ", "))}
		}
		if err := nonEmpty(name, v[name]); err != nil {
			return err
		}
	}
	return nil
}

// nonEmpty refuses a parameter given without a value ("?namespace=" or
// "?namespace"): an empty filter would otherwise read as no filter and
// select everything, which is never what a caller who named the filter
// meant.
func nonEmpty(name string, values []string) error {
	if slices.Contains(values, "") {
		return &QueryError{fmt.Sprintf("query parameter %q is empty: give it a value, or leave it out", name)}
	}
	return nil
}

// Query parses the request's query with ParseQuery and refuses any
// parameter not in allowed, and any given with an empty value (an empty
// filter is not "no filter": leave the parameter out for that). The
// values are returned by name (one each).
func Query(r *http.Request, allowed ...string) (map[string]string, error) {
	v, err := ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(v))
	for _, name := range sortedKeys(v) {
		if !slices.Contains(allowed, name) {
			if len(allowed) == 0 {
				return nil, &QueryError{fmt.Sprintf("unknown query parameter %q: %s %s takes none", name, r.Method, r.URL.Path)}
			}
			return nil, &QueryError{fmt.Sprintf("unknown query parameter %q: %s %s takes %s", name, r.Method, r.URL.Path, strings.Join(allowed, ", "))}
		}
		if err := nonEmpty(name, v[name]); err != nil {
			return nil, err
		}
		out[name] = v[name][0]
	}
	return out, nil
}

// CheckQuery is Query for handlers: on error it writes the 400 and
// returns false.
func CheckQuery(w http.ResponseWriter, r *http.Request, allowed ...string) (map[string]string, bool) {
	q, err := Query(r, allowed...)
	if err != nil {
		WriteError(w, http.StatusBadRequest, CodeInvalidArgument, err.Error())
		return nil, false
	}
	return q, true
}

// NoQuery wraps a handler that takes no query parameters: any is a 400.
func NoQuery(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := CheckQuery(w, r); ok {
			h.ServeHTTP(w, r)
		}
	})
}

func sortedKeys(v url.Values) []string {
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// IsJSON reports whether a Content-Type header value is JSON:
// application/json in any letter case (media types are case-insensitive),
// with parameters, a charset only if it is UTF-8.
func IsJSON(contentType string) bool {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "application/json" {
		return false
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return false
	}
	return true
}

// SingleHeaders are the request headers that carry one value: given
// twice, servers resolve them differently (Go's Header.Get takes the
// first; a proxy in front may take the last), so a request that repeats
// one is refused rather than read as either.
var SingleHeaders = []string{"Authorization", "Beacon-Secret", "Last-Event-ID", "Content-Type", "Origin", "Sec-Fetch-Site"}

// RepeatedHeader returns the first of names that r carries on more than
// one header line, and on how many; "" if none.
func RepeatedHeader(r *http.Request, names ...string) (string, int) {
	for _, name := range names {
		n := len(r.Header.Values(name))
		if n > 1 {
			return name, n
		}
	}
	return "", 0
}

// RefuseRepeatedHeaders wraps h: a request carrying one of SingleHeaders
// more than once is answered 400 invalid_argument saying to send one.
func RefuseRepeatedHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, n := RepeatedHeader(r, SingleHeaders...); name != "" {
			WriteError(w, http.StatusBadRequest, CodeInvalidArgument,
				fmt.Sprintf("the %s header is given %d times: send it once (servers and proxies read repeated ones differently)", name, n))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Accepts reports whether a request's Accept header allows mediaType
// ("type/subtype"): no Accept, */*, type/* or the type itself, with a
// quality above zero. A header that cannot be parsed allows everything (as
// if absent).
func Accepts(r *http.Request, mediaType string) bool {
	values := r.Header.Values("Accept")
	if len(values) == 0 {
		return true
	}
	typ, _, _ := strings.Cut(mediaType, "/")
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			if strings.TrimSpace(item) == "" {
				continue
			}
			mt, params, err := mime.ParseMediaType(item)
			if err != nil {
				return true
			}
			if q, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(q, 64); err == nil && f <= 0 {
					continue
				}
			}
			if mt == "*/*" || mt == typ+"/*" || mt == mediaType {
				return true
			}
		}
	}
	return false
}

// DecodeJSON reads a JSON request body strictly into v: a JSON
// Content-Type (or none), at most limit bytes, exactly one JSON value with
// no unknown fields, no key given twice in any object (metadata maps
// included), no field named in another letter case than its own
// ("Address" for "address", which encoding/json accepts) and no null
// (which encoding/json takes as the zero value); an empty body is
// refused. On error it writes the
// 415, 413 or 400 and returns false. A decoding error matching one of
// plain (an UnmarshalJSON error of a field type) is reported with its own
// message rather than as malformed JSON.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any, limit int64, plain ...error) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" && !IsJSON(ct) {
		WriteError(w, http.StatusUnsupportedMediaType, CodeInvalidArgument,
			fmt.Sprintf("Content-Type %q: send application/json", ct))
		return false
	}
	if ce := r.Header.Values("Content-Encoding"); len(ce) > 0 && !(len(ce) == 1 && strings.EqualFold(strings.TrimSpace(ce[0]), "identity")) {
		WriteError(w, http.StatusUnsupportedMediaType, CodeInvalidArgument,
			fmt.Sprintf("Content-Encoding %q: compressed bodies are not accepted: send the JSON uncompressed, without Content-Encoding", strings.Join(ce, ", ")))
		return false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err == nil {
		if msg := notJSONText(body); msg != "" {
			WriteError(w, http.StatusBadRequest, CodeInvalidArgument, "JSON body: "+msg)
			return false
		}
		// encoding/json would turn invalid UTF-8 (and lone surrogate
		// escapes) into U+FFFD without a word: refuse them instead.
		if verr := beacon.ValidateJSONText(body); verr != nil {
			WriteError(w, http.StatusBadRequest, CodeInvalidArgument, "JSON body: "+verr.Error())
			return false
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err == nil {
		err = dec.Decode(v)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			WriteError(w, http.StatusRequestEntityTooLarge, CodeInvalidArgument, fmt.Sprintf("body larger than %d bytes", limit))
		case errors.Is(err, os.ErrDeadlineExceeded):
			WriteError(w, http.StatusRequestTimeout, CodeInvalidArgument,
				"the request body did not arrive within the server's request timeout: send it with the request, not slowly after it")
		case errors.Is(err, io.EOF):
			WriteError(w, http.StatusBadRequest, CodeInvalidArgument, "empty body: send a JSON object")
		default:
			for _, p := range plain {
				if errors.Is(err, p) {
					WriteError(w, http.StatusBadRequest, CodeInvalidArgument, err.Error())
					return false
				}
			}
			// A body of another JSON type than the object wanted ([],
			// "x", 3): encoding/json names the Go type, which means
			// nothing to a client.
			var ute *json.UnmarshalTypeError
			if errors.As(err, &ute) && ute.Field == "" && ute.Type != nil && ute.Type.Kind() == reflect.Struct {
				WriteError(w, http.StatusBadRequest, CodeInvalidArgument, "the body must be a JSON object, not "+jsonKind(ute.Value))
				return false
			}
			WriteError(w, http.StatusBadRequest, CodeInvalidArgument, "malformed JSON body: "+err.Error())
		}
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			WriteError(w, http.StatusRequestEntityTooLarge, CodeInvalidArgument, fmt.Sprintf("body larger than %d bytes", limit))
			return false
		}
		WriteError(w, http.StatusBadRequest, CodeInvalidArgument, "malformed JSON body: more than one JSON value")
		return false
	}
	if err := strictKeys(body, v); err != nil {
		WriteError(w, http.StatusBadRequest, CodeInvalidArgument, err.Error())
		return false
	}
	return true
}

// jsonKind names a JSON value kind as UnmarshalTypeError.Value gives it
// ("array", "string", "number 3", "bool") with its article.
func jsonKind(v string) string {
	if v == "array" {
		return "an array"
	}
	return "a " + v
}

// notJSONText names what a body that is not JSON text at all starts with
// ("" if none of them): compressed data sent without Content-Encoding, or
// a byte order mark. Without it they were answered "must be valid UTF-8"
// or with the JSON parser's "invalid character 'ï'".
func notJSONText(body []byte) string {
	for _, m := range []struct {
		magic []byte
		what  string
	}{
		{[]byte{0x1f, 0x8b}, "is gzip-compressed (it starts with gzip's magic bytes 1f 8b): compressed bodies are not accepted: send the JSON uncompressed"},
		{[]byte{0x28, 0xb5, 0x2f, 0xfd}, "is zstd-compressed (it starts with zstd's magic bytes): compressed bodies are not accepted: send the JSON uncompressed"},
		{[]byte{0xef, 0xbb, 0xbf}, "starts with a UTF-8 byte order mark (ef bb bf), which JSON does not allow: send the JSON without it"},
		{[]byte{0xfe, 0xff}, "starts with a UTF-16 byte order mark (fe ff): send the JSON in UTF-8"},
		{[]byte{0xff, 0xfe}, "starts with a UTF-16 byte order mark (ff fe): send the JSON in UTF-8"},
	} {
		if bytes.HasPrefix(body, m.magic) {
			return "the body " + m.what
		}
	}
	return ""
}

// Mux is an http.ServeMux that answers paths it does not serve with a
// JSON 404, methods a path does not take with a JSON 405 (and Allow), and
// remembers the patterns it was given, so that a test can check them
// against the API's documentation.
type Mux struct {
	mux      *http.ServeMux
	mu       sync.Mutex
	patterns []string
	// NotFound, when set, describes the API in the 404's message.
	NotFound string
	// Queries, when set, gives the query rule of a registered pattern
	// (for instance from the API's OpenAPI document): before a route it
	// knows runs, its query is checked, and anything the rule does not
	// allow is a 400. Routes it does not know check their own.
	Queries func(pattern string) (QueryRule, bool)
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{mux: http.NewServeMux()} }

// Handle registers h for pattern (http.ServeMux's syntax).
func (m *Mux) Handle(pattern string, h http.Handler) {
	m.mux.Handle(pattern, h)
	m.mu.Lock()
	m.patterns = append(m.patterns, pattern)
	m.mu.Unlock()
}

// HandleFunc registers f for pattern.
func (m *Mux) HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(f))
}

// Patterns returns the registered patterns, in registration order.
func (m *Mux) Patterns() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.patterns)
}

// Serves reports whether a request of method for path (with any {name}
// segment filled by a plausible value) reaches a registered pattern.
func (m *Mux) Serves(method, path string) bool {
	r, err := http.NewRequest(method, "http://beacon"+FillPath(path), nil)
	if err != nil {
		return false
	}
	_, p := m.mux.Handler(r)
	return p != ""
}

// FillPath replaces each {name} segment of a path template with a value
// of that name's shape, for probing routes.
func FillPath(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") {
			name := strings.TrimSuffix(strings.TrimPrefix(p, "{"), "}")
			parts[i] = pathSample(strings.TrimSuffix(name, "..."))
		}
	}
	return strings.Join(parts, "/")
}

func pathSample(name string) string {
	switch name {
	case "id":
		return "00000000000000a1"
	case "namespace":
		return "prod"
	case "component":
		return "api"
	case "endpoint":
		return "http"
	}
	return "x" + name
}

// RefuseUncleanPath answers a request whose path has an empty, "." or
// ".." segment with a JSON 400 naming the clean path, and reports whether
// it did: http.ServeMux would redirect (307, no body) to the clean path,
// and an API answers in JSON, to a client that should send the path it
// means. The path is judged as sent: an escaped slash (%2F) is within a
// segment, not between two; CONNECT's request has no path.
func RefuseUncleanPath(w http.ResponseWriter, r *http.Request) bool {
	sent := r.URL.EscapedPath()
	if sent == "" {
		return false
	}
	clean := cleanPath(sent)
	if clean == sent {
		return false
	}
	WriteError(w, http.StatusBadRequest, CodeInvalidArgument, fmt.Sprintf(
		"path %s has an empty, '.' or '..' segment: request %s", sent, clean))
	return true
}

// cleanPath is p without empty, "." and ".." segments, keeping a trailing
// slash (as http.ServeMux cleans a path before it redirects).
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// methods a 405 may list.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// ServeHTTP routes r; see Mux.
func (m *Mux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if RefuseUncleanPath(w, r) {
		return
	}
	if _, pattern := m.mux.Handler(r); pattern != "" {
		if m.Queries != nil {
			if rule, ok := m.Queries(pattern); ok {
				if err := rule.check(r); err != nil {
					WriteError(w, http.StatusBadRequest, CodeInvalidArgument, err.Error())
					return
				}
			}
		}
		m.mux.ServeHTTP(w, r)
		return
	}
	var allow []string
	for _, method := range methods {
		probe := *r
		probe.Method = method
		if _, p := m.mux.Handler(&probe); p != "" {
			allow = append(allow, method)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		WriteError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			fmt.Sprintf("%s is not allowed on %s; use %s", r.Method, r.URL.EscapedPath(), strings.Join(allow, ", ")))
		return
	}
	msg := fmt.Sprintf("no route %s %s", r.Method, r.URL.EscapedPath()) // as sent: %2F stays

	if m.NotFound != "" {
		msg += "; " + m.NotFound
	}
	WriteError(w, http.StatusNotFound, CodeNotFound, msg)
}
