package ui_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/beaconplane/beacon/server/ui"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// startHandlers serves the dashboard and the registry API over the memory
// backend, without the rest of beacon serve.
func startHandlers(t *testing.T, uiOpts ui.Config, apiOpts registryapi.Config, wrap func(http.Handler) http.Handler) (*httptest.Server, *registry.StoreRegistry) {
	t.Helper()
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	return startHandlersOn(t, st, uiOpts, apiOpts, wrap)
}

// startHandlersOn is startHandlers over the store st.
func startHandlersOn(t *testing.T, st store.Store, uiOpts ui.Config, apiOpts registryapi.Config, wrap func(http.Handler) http.Handler) (*httptest.Server, *registry.StoreRegistry) {
	t.Helper()
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	api, err := registryapi.New(reg, apiOpts)
	if err != nil {
		t.Fatal(err)
	}
	dash, err := ui.New(uiOpts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for _, p := range registryapi.Routes() {
		mux.Handle(p, api)
	}
	mux.Handle(ui.Prefix, dash)
	var h http.Handler = mux
	if wrap != nil {
		h = wrap(mux)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, reg
}

// openHandlersPage opens a page of startHandlers' server. The handlers
// alone have no /v1/cluster: the page then watches everything, as it does
// on a server without authentication, after the browser logs the 404.
func openHandlersPage(t *testing.T, base, path string) *page {
	t.Helper()
	p := openPage(t, base, path)
	p.allowConsole(`404 \(Not Found\) .*/v1/cluster$`)
	return p
}

// TestStreamParserInBrowser runs the page's event-stream parser (the one
// the dashboard reads /v1/registry/watch with) in Chromium: every way of
// cutting a stream into chunks gives the same events, and the corner
// cases of the format (CRLF, comments, multi-line data, ids applied at
// dispatch, retry, fields without a colon) come out as the spec says.
func TestStreamParserInBrowser(t *testing.T) {
	srv, _ := startHandlers(t, ui.Config{}, registryapi.Config{}, nil)
	p := openHandlersPage(t, srv.URL, "/ui/events")
	type result struct {
		OK       bool   `json:"ok"`
		Detail   string `json:"detail"`
		Checked  int    `json:"checked"`
		Expected string `json:"expected"`
	}
	res := eval[result](p, `(async () => {
  const { Parser } = await import('/ui/assets/js/stream.js');
  const run = (chunks) => {
    const out = [];
    const ps = new Parser((type, data, id) => out.push({ type, data, id }));
    ps.onId = (id) => out.push({ lastId: id });
    ps.onRetry = (ms) => out.push({ retry: ms });
    for (const c of chunks) ps.push(c);
    return JSON.stringify(out);
  };
  const stream = 'retry: 1000\n\n' +
    ': keep-alive\n\n' +
    'event: snapshot\nid: 7\ndata: {"revision":7,"instances":[{"metadata":{"k":"é ✓ \\"quoted\\" <b>"}}]}\n\n' +
    'event: added\r\ndata: {"a":1}\r\n\r\n' +
    'data: line one\ndata: line two\n\n' +
    'data\n\n' +
    'event: removed\nid: 9\ndata:no-space\n\n' +
    'id: 10\n\n' +
    'event: ignored-without-data\n\n' +
    'unknown: field\ndata: x\n\n';
  const expected = run([stream]);
  // Every cut into two and three pieces, and random cuts into many.
  let checked = 0;
  const fail = (chunks) => ({ ok: false, detail: JSON.stringify(chunks) + ' gave ' + run(chunks), checked, expected });
  for (let i = 0; i <= stream.length; i++) {
    const c = [stream.slice(0, i), stream.slice(i)];
    checked++;
    if (run(c) !== expected) return fail(c);
    for (let j = i; j <= stream.length; j += 7) {
      const c3 = [stream.slice(0, i), stream.slice(i, j), stream.slice(j)];
      checked++;
      if (run(c3) !== expected) return fail(c3);
    }
  }
  let seed = 42;
  const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  for (let n = 0; n < 2000; n++) {
    const chunks = [];
    let at = 0;
    while (at < stream.length) { const len = 1 + Math.floor(rnd() * 12); chunks.push(stream.slice(at, at + len)); at += len; }
    checked++;
    if (run(chunks) !== expected) return fail(chunks);
  }
  return { ok: true, checked, expected, detail: '' };
})()`)
	if !res.OK {
		t.Fatalf("chunks %s;\nwant %s", res.Detail, res.Expected)
	}
	t.Logf("%d ways of cutting the stream agree: %s", res.Checked, res.Expected)
	want := `[{"retry":1000},{"lastId":"7"},{"type":"snapshot","data":"{\"revision\":7,\"instances\":[{\"metadata\":{\"k\":\"é ✓ \\\"quoted\\\" <b>\"}}]}","id":"7"},` +
		`{"type":"added","data":"{\"a\":1}","id":null},{"type":"message","data":"line one\nline two","id":null},` +
		`{"type":"message","data":"","id":null},{"lastId":"9"},{"type":"removed","data":"no-space","id":"9"},{"lastId":"10"},` +
		`{"type":"message","data":"x","id":null}]`
	if res.Expected != want {
		t.Errorf("parsed\n %s\nwant\n %s", res.Expected, want)
	}
}

// TestModelInBrowser runs the page's registry model in Chromium: counts up
// the tree, drains, replays that change nothing, a re-list applied as a
// difference, and sorted lists kept in place.
func TestModelInBrowser(t *testing.T) {
	srv, _ := startHandlers(t, ui.Config{}, registryapi.Config{}, nil)
	p := openHandlersPage(t, srv.URL, "/ui/events")
	got := eval[[]string](p, `(async () => {
  const { Model } = await import('/ui/assets/js/model.js');
  const out = [];
  const check = (ok, what) => { if (!ok) out.push(what); };
  const inst = (ns, c, e, id, extra) => Object.assign({ namespace: ns, component: c, endpoint: e, id, address: '10.0.0.' + parseInt(id, 16) + ':80', transport: 'http', status: 'serving', registered_at: '2026-11-25T10:00:00Z' }, extra || {});
  const m = new Model();
  m.snapshot({ revision: 5, instances: [inst('a', 'x', 'p', '0000000000000001'), inst('a', 'x', 'p', '0000000000000002'), inst('a', 'y', 'q', '0000000000000003'), inst('b', 'z', 'r', '0000000000000004')] });
  check(m.root.total === 4 && m.node(['a']).total === 3 && m.node(['a', 'x']).total === 2 && m.root.endpoints === 3, 'snapshot counts');
  m.change('updated', { instance: inst('a', 'x', 'p', '0000000000000001', { status: 'draining' }), revision: 6, batch: 'changes' });
  check(m.node(['a', 'x', 'p']).draining === 1 && m.node(['a']).serving === 2 && m.root.draining === 1, 'drain counts');
  check(m.events[m.events.length - 1].kind === 'drain', 'drain event');
  const n = m.events.length;
  m.change('updated', { instance: inst('a', 'x', 'p', '0000000000000001', { status: 'draining' }), revision: 6, batch: 'changes' });
  m.change('added', { instance: inst('a', 'y', 'q', '0000000000000003'), revision: 6, batch: 'changes' });
  m.change('removed', { instance: inst('c', 'c', 'c', '0000000000000009'), revision: 6, batch: 'changes' });
  check(m.events.length === n && m.root.total === 4, 'replays change nothing');
  m.change('removed', { instance: inst('b', 'z', 'r', '0000000000000004'), revision: 7, batch: 'changes' });
  check(!m.node(['b']) && m.root.endpoints === 2 && m.revision === 7, 'empty nodes go');
  // A re-list after a compaction: 2 left, 1 changed address, 5 joined.
  m.snapshot({ revision: 20, instances: [inst('a', 'x', 'p', '0000000000000001', { status: 'draining' }), inst('a', 'y', 'q', '0000000000000003', { address: '10.9.9.9:80' }), inst('d', 'd', 'd', '0000000000000005')] });
  const last = m.events.slice(-4).map(e => e.kind + ':' + (e.batch || '')).join(' ');
  check(last === 'leave:resync update:resync join:resync system:', 'resync events: ' + last);
  check(m.root.total === 3 && m.revision === 20, 'resync state');
  // Changes for a sorted view: what changed since a sequence number.
  const seq = m.changeSeq;
  m.change('added', { instance: inst('a', 'x', 'p', '0000000000000006'), revision: 21, batch: 'changes' });
  const ch = m.changesSince(seq);
  check(ch.length === 1 && ch[0].kind === 'add' && ch[0].rec.key === 'a/x/p/0000000000000006', 'changesSince');
  check(m.changesSince(m.changeSeq).length === 0, 'no changes');
  // Health: a verdict change alone is a change, counted up the tree and
  // logged as failing / routed again; panic is served (not failing).
  const check0 = { check: { kind: 'tcp' } };
  m.change('added', { instance: inst('h', 'x', 'p', '0000000000000007', { ...check0, health: { status: 'passing' } }), revision: 22, batch: 'changes' });
  m.change('updated', { instance: inst('h', 'x', 'p', '0000000000000007', { ...check0, health: { status: 'failing', reason: 'refused' } }), revision: 23, batch: 'changes' });
  const failed = m.events[m.events.length - 1];
  check(failed.kind === 'fail' && failed.detail === 'health passing → failing: refused', 'fail event: ' + failed.kind + ' ' + failed.detail);
  check(m.node(['h', 'x', 'p']).failing === 1 && m.node(['h']).failing === 1 && m.root.failing === 1 && m.node(['h']).serving === 1, 'failing counts');
  check(m.recs.get('h/x/p/0000000000000007').health === 'failing' && m.recs.get('h/x/p/0000000000000007').search.includes('failing'), 'failing rec');
  m.change('updated', { instance: inst('h', 'x', 'p', '0000000000000007', { ...check0, health: { status: 'failing', reason: 'refused', panic: true } }), revision: 24, batch: 'changes' });
  check(m.events[m.events.length - 1].kind === 'recover' && m.root.failing === 0 && m.recs.get('h/x/p/0000000000000007').health === 'panic', 'panic is served');
  m.change('updated', { instance: inst('h', 'x', 'p', '0000000000000007', { ...check0, health: { status: 'failing', reason: 'refused' } }), revision: 25, batch: 'changes' });
  m.change('removed', { instance: inst('h', 'x', 'p', '0000000000000007'), revision: 26, batch: 'changes' });
  check(m.root.failing === 0 && !m.node(['h']), 'a failing instance that leaves is no longer counted');
  m.change('added', { instance: inst('h', 'x', 'p', '0000000000000008', check0), revision: 27, batch: 'changes' });
  check(m.recs.get('h/x/p/0000000000000008').health === 'unknown', 'a check without a verdict is unknown');
  return out;
})()`)
	if len(got) != 0 {
		t.Errorf("model checks failed: %q", got)
	}
}
