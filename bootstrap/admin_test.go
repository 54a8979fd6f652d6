package bootstrap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestTokenAdmin(t *testing.T) {
	srv := registryServer(t)
	cli := client(t, srv)
	ctx := testCtx(t, 20*time.Second)
	tok := bootstrap.NewToken()
	if err := bootstrap.ValidateToken(tok); err != nil {
		t.Fatalf("NewToken gave %q: %v", tok, err)
	}
	if _, err := bootstrap.TokenStatus(ctx, cli, tok); !errors.Is(err, bootstrap.ErrTokenNotFound) {
		t.Fatalf("status of a new token: %v", err)
	}
	if _, err := bootstrap.CreateToken(ctx, cli, tok, 3); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, bootstrap.SizeKey(tok))
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "3" {
		t.Fatalf("size key: %v, %v", resp, err)
	}
	// Single use: the same token again is refused, also once members
	// registered and even when only members remain.
	if _, err := bootstrap.CreateToken(ctx, cli, tok, 5); !errors.Is(err, bootstrap.ErrTokenExists) || !strings.Contains(err.Error(), "size 3") {
		t.Fatalf("reused token: %v", err)
	}
	orphan := bootstrap.NewToken()
	if _, err := cli.Put(ctx, bootstrap.MembersPrefix(orphan)+"/1", "a=http://a:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.CreateToken(ctx, cli, orphan, 3); !errors.Is(err, bootstrap.ErrTokenExists) ||
		!strings.Contains(err.Error(), "1 members registered") {
		t.Fatalf("token with members only: %v", err)
	}
	if _, err := bootstrap.TokenStatus(ctx, cli, orphan); !errors.Is(err, bootstrap.ErrSizeNotFound) {
		t.Fatalf("status without size: %v", err)
	}
	for _, bad := range []struct {
		tok  string
		size int
		want error
	}{
		{"a/b", 3, bootstrap.ErrInvalidToken},
		{bootstrap.NewToken(), 0, bootstrap.ErrInvalidSize},
		{bootstrap.NewToken(), -1, bootstrap.ErrInvalidSize},
		{bootstrap.NewToken(), bootstrap.MaxSize + 1, bootstrap.ErrInvalidSize},
	} {
		if _, err := bootstrap.CreateToken(ctx, cli, bad.tok, bad.size); !errors.Is(err, bad.want) {
			t.Errorf("CreateToken(%q, %d) = %v, want %v", bad.tok, bad.size, err, bad.want)
		}
	}

	n, err := bootstrap.RemoveToken(ctx, cli, tok)
	if err != nil || n != 2 { // the size and the creation time
		t.Fatalf("remove: %d, %v", n, err)
	}
	if _, err := bootstrap.RemoveToken(ctx, cli, tok); !errors.Is(err, bootstrap.ErrTokenNotFound) {
		t.Fatalf("remove twice: %v", err)
	}
	// Removal never touches a token whose name extends this one.
	other := tok + "x"
	if _, err := bootstrap.CreateToken(ctx, cli, other, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.CreateToken(ctx, cli, tok, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.RemoveToken(ctx, cli, tok); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.TokenStatus(ctx, cli, other); err != nil {
		t.Fatalf("neighbour token: %v", err)
	}
	if got := bootstrap.MemberFlags(tok, []string{"http://a:2379", "http://b:2379"}); got !=
		"--discovery-token="+tok+" --discovery-endpoints=http://a:2379,http://b:2379" {
		t.Fatalf("flags %q", got)
	}
}

func TestTokenHTTPAPI(t *testing.T) {
	srv := registryServer(t)
	cli := client(t, srv)
	h := bootstrap.NewHandler(cli, srv.Endpoints(), nil)
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	contentType := ""
	call := func(method, path, body string, out any) int {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %s: content type %q: %s", method, path, ct, b)
		}
		if resp.StatusCode >= 300 {
			var e bootstrap.ErrorResponse
			if err := json.Unmarshal(b, &e); err != nil || e.Code == "" || e.Message == "" {
				t.Fatalf("%s %s: error body %s", method, path, b)
			}
			if out, ok := out.(*bootstrap.ErrorResponse); ok {
				*out = e
			}
			return resp.StatusCode
		}
		if out != nil {
			if err := json.NewDecoder(bytes.NewReader(b)).Decode(out); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode
	}

	var created bootstrap.CreateTokenResponse
	if code := call("POST", "/v1/tokens", `{"size": 2}`, &created); code != 201 || created.Size != 2 ||
		created.Flags != bootstrap.MemberFlags(created.Token, srv.Endpoints()) {
		t.Fatalf("create: %d %+v", code, created)
	}
	var def bootstrap.CreateTokenResponse
	contentType = "application/JSON; charset=UTF-8" // media types are case-insensitive
	if code := call("POST", "/v1/tokens", "{}", &def); code != 201 || def.Size != 3 {
		t.Fatalf("create with defaults: %d %+v", code, def)
	}
	contentType = ""
	var e bootstrap.ErrorResponse
	// An empty body is refused (it is not "the defaults": send {}), as are
	// another content type, query parameters and trailing data.
	if code := call("POST", "/v1/tokens", "", &e); code != 400 || e.Code != "invalid_argument" || !strings.Contains(e.Message, "empty body") {
		t.Fatalf("empty body: %d %+v", code, e)
	}
	contentType = "text/plain"
	if code := call("POST", "/v1/tokens", `{"size": 3}`, &e); code != 415 {
		t.Fatalf("text/plain body: %d %+v", code, e)
	}
	contentType = ""
	if code := call("POST", "/v1/tokens?size=3", `{}`, &e); code != 400 || !strings.Contains(e.Message, `unknown query parameter "size"`) {
		t.Fatalf("query parameter: %d %+v", code, e)
	}
	if code := call("POST", "/v1/tokens", `{"size": 3} {}`, &e); code != 400 || !strings.Contains(e.Message, "more than one JSON value") {
		t.Fatalf("trailing data: %d %+v", code, e)
	}
	// The etcd server is shared with other tests: look at this test's
	// tokens only.
	var list bootstrap.ListTokensResponse
	mine := func() []bootstrap.TokenSummary {
		var out []bootstrap.TokenSummary
		for _, tok := range list.Tokens {
			if tok.Token == created.Token || tok.Token == def.Token {
				out = append(out, tok)
			}
		}
		return out
	}
	if code := call("GET", "/v1/tokens", "", &list); code != 200 || len(mine()) != 2 || list.Revision == 0 {
		t.Fatalf("list: %d %+v", code, list)
	}
	for i, want := range []string{created.Token, def.Token} {
		tok := mine()[i]
		if tok.Token != want || tok.State != bootstrap.StateWaiting || tok.Full || tok.Registered != 0 || tok.CreatedAt == nil ||
			time.Since(*tok.CreatedAt) > time.Minute || tok.CreatedRevision == 0 {
			t.Fatalf("list[%d] = %+v, want %s waiting", i, tok, want)
		}
	}
	for body, code := range map[string]string{
		`{"size": 0}`: "invalid_argument", `{"size": -2}`: "invalid_argument", `{"size": "3"}`: "invalid_argument",
		`{"size": 1001}`: "invalid_argument", `{"size": 3, "tok": "x"}`: "invalid_argument",
		`{"token": "a/b"}`: "invalid_argument", `not json`: "invalid_argument",
	} {
		e = bootstrap.ErrorResponse{}
		got := call("POST", "/v1/tokens", body, &e)
		if got != 400 || e.Code != code {
			t.Errorf("POST %s: %d %+v", body, got, e)
		}
	}
	// What encoding/json accepts silently (the last of two keys, a field
	// name in another letter case) and absurd numbers are refused with a
	// message that names the key or states the range.
	for body, want := range map[string]string{
		`{"size": 3, "size": 5}`:         `key "size" is given twice`,
		`{"Size": 3}`:                    `unknown field "Size": field names are case-sensitive: did you mean "size"?`,
		`{"size": 1e308}`:                "size 1e308: want a whole number, 1 to 1000",
		`{"size": 99999999999999999999}`: "size 99999999999999999999: want a whole number, 1 to 1000",
		`{"size": 3.5}`:                  "size 3.5: want a whole number, 1 to 1000",
		`{"size": "3"}`:                  `size "3": want a number, 1 to 1000`,
		`{"size": 3, "TOKEN": "x"}`:      `did you mean "token"?`,
		// null was taken as absent: the default size, a fresh token.
		`{"size": null}`:             `"size" is null: null is not a value here`,
		`{"size": 3, "token": null}`: `"token" is null`,
		"\x1f\x8b\x08\x00":           "the body is gzip-compressed",
		"\xef\xbb\xbf{\"size\": 3}":  "byte order mark",
	} {
		e = bootstrap.ErrorResponse{}
		got := call("POST", "/v1/tokens", body, &e)
		if got != 400 || e.Code != "invalid_argument" || !strings.Contains(e.Message, want) {
			t.Errorf("POST %s: %d %+v, want 400 saying %q", body, got, e, want)
		}
	}
	if code := call("POST", "/v1/tokens", `{"token": "`+created.Token+`"}`, &e); code != 409 || e.Code != "already_exists" {
		t.Fatalf("reuse: %d %+v", code, e)
	}

	var st bootstrap.TokenStatusResponse
	if code := call("GET", "/v1/tokens/"+created.Token, "", &st); code != 200 || st.State != bootstrap.StateWaiting || st.Registered != 0 {
		t.Fatalf("status: %d %+v", code, st)
	}
	ctx := testCtx(t, 20*time.Second)
	cfg := config(srv, created.Token)
	first := joinAsync(t, ctx, cfg, "a", peerURL(0))
	if _, err := bootstrap.Join(ctx, cfg, "b", []string{peerURL(1)}); err != nil {
		t.Fatal(err)
	}
	if r := await(t, first, "first join"); r.err != nil {
		t.Fatal(r.err)
	}
	if code := call("GET", "/v1/tokens/"+created.Token, "", &st); code != 200 || st.State != bootstrap.StateFull ||
		st.InitialCluster == "" || st.Registered != 2 {
		t.Fatalf("full status: %d %+v", code, st)
	}
	if code := call("GET", "/v1/tokens/nope", "", &e); code != 404 || e.Code != "not_found" {
		t.Fatalf("unknown token: %d %+v", code, e)
	}
	var rm bootstrap.RemoveTokenResponse
	if code := call("GET", "/v1/tokens", "", &list); code != 200 || len(mine()) != 2 || !mine()[0].Full ||
		mine()[0].Registered != 2 || mine()[0].Members != 2 || mine()[0].State != bootstrap.StateFull {
		t.Fatalf("list with a full token: %d %+v", code, list)
	}
	if code := call("DELETE", "/v1/tokens/"+created.Token, "", &rm); code != 200 || rm.Deleted != 6 {
		t.Fatalf("remove: %d %+v", code, rm)
	}
	if code := call("PUT", "/v1/tokens/x", "", &e); code != 405 || e.Code != "method_not_allowed" {
		t.Fatalf("PUT: %d %+v", code, e)
	}
	if code := call("DELETE", "/v1/tokens", "", &e); code != 405 || e.Code != "method_not_allowed" {
		t.Fatalf("DELETE list: %d %+v", code, e)
	}
	if code := call("GET", "/v1/other", "", &e); code != 404 || e.Code != "not_found" {
		t.Fatalf("other path: %d", code)
	}
}

// TestListTokens: every token of the registry, with what is known of it:
// one made by CreateToken (with its creation time), one written by hand as
// etcd's documentation does (no creation time), one with a bad size and
// one with registrations but no size key.
func TestListTokens(t *testing.T) {
	// An etcd of its own: the listing is of the whole registry.
	srv := etcdtest.Start(t, etcdtest.Options{Name: "list"})
	cli := client(t, srv)
	ctx := testCtx(t, 20*time.Second)
	made, byHand, bad, orphan := "a-made", "b-by-hand", "c-bad-size", "d-orphan"
	id, err := bootstrap.MemberID([]string{"http://10.0.0.1:2380"}, made)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.CreateToken(ctx, cli, made, 1); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		bootstrap.SizeKey(byHand):                   "2",
		bootstrap.SizeKey(bad):                      "two",
		bootstrap.MembersPrefix(orphan) + "/1":      "a=http://10.0.0.1:2380",
		bootstrap.RegistryPrefix + "/not a token/x": "ignored",
		bootstrap.MemberKey(made, id):               "m1=http://10.0.0.1:2380",
	} {
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	list, err := bootstrap.ListTokens(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bootstrap.TokenSummary{}
	for _, s := range list.Tokens {
		got[s.Token] = s
	}
	if len(got) != 4 {
		t.Fatalf("tokens: %+v", list.Tokens)
	}
	if s := got[made]; s.Size != 1 || !s.Full || s.State != bootstrap.StateFull || s.Registered != 1 || s.CreatedAt == nil || s.Problem != "" {
		t.Errorf("created token: %+v", s)
	}
	if s := got[byHand]; s.Size != 2 || s.Full || s.State != bootstrap.StateWaiting || s.CreatedAt != nil || s.CreatedRevision == 0 {
		t.Errorf("token written by hand: %+v", s)
	}
	// Every token has a state, also one whose size cannot be read.
	if s := got[bad]; s.Size != 0 || s.State != bootstrap.StateBadSize || !strings.Contains(s.Problem, "size key is bad") {
		t.Errorf("bad size: %+v", s)
	}
	if s := got[orphan]; s.Members != 1 || s.State != bootstrap.StateNoSize || !strings.Contains(s.Problem, "size key not found") {
		t.Errorf("orphan: %+v", s)
	}
	if list.Tokens[0].Token != made {
		t.Errorf("tokens not in creation order: %+v", list.Tokens)
	}

	// A full token whose two members share a name cannot form a cluster:
	// it was listed as plain full; now with the clash, as token status
	// says it.
	clash := "e-clash"
	if _, err := bootstrap.CreateToken(ctx, cli, clash, 2); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{"http://10.0.0.1:2380", "http://10.0.0.2:2380"} {
		mid, err := bootstrap.MemberID([]string{url}, clash)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, bootstrap.MemberKey(clash, mid), "infra="+url); err != nil {
			t.Fatal(err)
		}
	}
	list, err = bootstrap.ListTokens(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Tokens {
		if s.Token == clash && (!s.Full || s.Size != 2 || !errors.Is(statusErr(ctx, t, cli, clash), bootstrap.ErrDuplicateName) ||
			!strings.Contains(s.Problem, `"infra" is registered by`)) {
			t.Errorf("token whose members share a name: %+v", s)
		}
	}
}

// statusErr is the error a token's initial cluster gives.
func statusErr(ctx context.Context, t *testing.T, cli *clientv3.Client, token string) error {
	t.Helper()
	st, err := bootstrap.TokenStatus(ctx, cli, token)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.InitialCluster()
	return err
}
