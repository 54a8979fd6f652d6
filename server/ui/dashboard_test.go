package ui_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/backend"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/server/ui"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
)

// TestPagesLoadWithoutConsoleErrors opens every page of the dashboard of a
// real `beacon serve`, in light and dark, and fails on any console error
// or uncaught exception (openPage checks at the end).
func TestPagesLoadWithoutConsoleErrors(t *testing.T) {
	s := startServer(t, nil)
	base := s.Endpoints().HTTP
	fleet := demoFleet()
	half := len(fleet) / 2
	for _, in := range fleet[:half] {
		register(t, s.Registry(), in)
	}

	// / redirects to the dashboard, which answers with its CSP.
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Request.URL.Path != ui.Prefix || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Security-Policy") != ui.ContentSecurityPolicy {
		t.Fatalf("GET / ended at %s with %d, CSP %q", resp.Request.URL, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}

	p := openPage(t, base, "/ui/")
	p.waitFor(`document.querySelector('#live').dataset.state === 'live'`, 5*time.Second)
	p.waitFor(fmt.Sprintf(`document.querySelector('.detail .count').textContent === '%d instances'`, half), 5*time.Second)
	// The rest joins while the page watches, and one instance drains.
	var last registry.Registration
	for _, in := range fleet[half:] {
		last = register(t, s.Registry(), in)
	}
	if err := last.Update(context.Background(), func(in *beacon.Instance) { in.Status = beacon.StatusDraining }); err != nil {
		t.Fatal(err)
	}
	p.waitFor(fmt.Sprintf(`document.querySelector('.detail .count').textContent === '%d instances' && document.querySelector('.stats .value.warn').textContent === '1'`, len(fleet)), 5*time.Second)
	// The README's picture: a namespace, one instance draining.
	eval[any](p, `([...document.querySelectorAll('.tree .titem')].find(r => r.querySelector('.name').textContent === 'payments').click(), null)`)
	p.waitFor(`location.pathname === '/ui/services/payments' && document.querySelectorAll('.grid .grow').length === 8`, 5*time.Second)
	p.screenshot("readme")
	p.click(`.crumbs a`)
	for _, scheme := range []string{"light", "dark"} {
		p.colorScheme(scheme)
		p.screenshot("services-" + scheme)
		p.click(`.tabs a[data-section="events"]`)
		p.waitFor(`location.pathname === '/ui/events' && document.querySelector('.page .count').textContent.includes('event')`, 5*time.Second)
		p.screenshot("events-" + scheme)
		p.click(`.tabs a[data-section="cluster"]`)
		p.waitFor(`document.querySelector('table.data caption')?.textContent.startsWith('etcd members (1 member')`, 10*time.Second)
		p.screenshot("cluster-" + scheme)
		p.click(`.tabs a[data-section="bootstrap"]`)
		p.waitFor(`location.pathname === '/ui/bootstrap' && document.querySelector('form.inline input')`, 5*time.Second)
		p.screenshot("bootstrap-" + scheme)
		p.click(`.tabs a[data-section="services"]`)
		p.waitFor(fmt.Sprintf(`location.pathname === '/ui/services' && document.querySelectorAll('.grid .grow').length === %d`, len(fleet)), 5*time.Second)
	}
	p.colorScheme("light")

	// An endpoint page, by URL, with an instance inspected.
	p.navigate("/ui/services/payments/api/grpc")
	p.waitFor(`document.querySelector('.detail h1').textContent === 'grpc' && document.querySelectorAll('.grid .grow').length === 4`, 5*time.Second)
	p.click(`.grid .grow:nth-child(2)`)
	p.waitFor(`!document.querySelector('.inspector').hidden`, 2*time.Second)
	p.screenshot("endpoint")
	// A phone-sized window stacks the tree above the instances.
	if err := chromedp.Do(p.ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	p.waitFor(`document.querySelector('.side').getBoundingClientRect().bottom <= document.querySelector('.detail').getBoundingClientRect().top + 1`, 2*time.Second)
	p.screenshot("narrow")
	if err := chromedp.Do(p.ctx, chromedp.EmulateViewport(1400, 860)); err != nil {
		t.Fatal(err)
	}
	// The cluster page shows the embedded member as leader and healthy.
	p.navigate("/ui/cluster")
	p.waitFor(`[...document.querySelectorAll('table.data tbody tr')].some(r => r.textContent.includes('leader') && r.textContent.includes('healthy'))`, 10*time.Second)
	// Unknown routes under /ui/ give the app, which says so.
	p.navigate("/ui/no/such/page")
	p.waitFor(`document.querySelector('main h1')?.textContent === 'No such page'`, 5*time.Second)
	p.screenshot("not-found")
}

// TestInstanceAppearsWithinOneSecond registers an instance through the
// registry while the page shows its (empty) endpoint, and measures, with
// the page's own clock, how long it takes to show up.
func TestInstanceAppearsWithinOneSecond(t *testing.T) {
	s := startServer(t, nil)
	p := openPage(t, s.Endpoints().HTTP, "/ui/services/demo/web/http")
	p.waitFor(`document.querySelector('#live').dataset.state === 'live'`, 5*time.Second)
	// The empty state tells how to register the first instance.
	p.waitFor(`document.querySelector('.empty h2')?.textContent === 'No instances registered yet' && document.querySelector('.empty pre').textContent.includes('beacon register demo/web/http')`, 5*time.Second)
	p.screenshot("empty")

	start := time.Now()
	reg := register(t, s.Registry(), beacon.Instance{Namespace: "demo", Component: "web", Endpoint: "http", Address: "10.1.0.1:8080", Transport: "http"})
	registered := time.Now()
	id := reg.Instance().ID
	seen := p.waitFor(fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes(%s))`, jsString(id)), 5*time.Second)
	latency := seen.Sub(registered)
	t.Logf("registered in %v; shown %v after Register returned", registered.Sub(start), latency)
	if latency > time.Second {
		t.Errorf("the instance appeared %v after registration, want within 1 s", latency)
	}
	p.waitFor(`document.querySelector('.tree [aria-level="3"] .name')?.textContent === 'http'`, time.Second)

	// The timeline has the join with its revision.
	p.click(`.tabs a[data-section="events"]`)
	p.waitFor(fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes('joined') && r.textContent.includes(%s))`, jsString(id)), 5*time.Second)
}

// TestDrainShowsDraining drains an instance with a grace period: the page
// shows it draining (row, tree and counts), then gone when the grace ends.
func TestDrainShowsDraining(t *testing.T) {
	s := startServer(t, nil)
	reg := register(t, s.Registry(), beacon.Instance{Namespace: "shop", Component: "cart", Endpoint: "http", Address: "10.2.0.1:8080", Transport: "http"})
	register(t, s.Registry(), beacon.Instance{Namespace: "shop", Component: "cart", Endpoint: "http", Address: "10.2.0.2:8080", Transport: "http"})
	id := reg.Instance().ID
	p := openPage(t, s.Endpoints().HTTP, "/ui/services/shop/cart/http")
	p.waitFor(`document.querySelectorAll('.grid .grow').length === 2`, 5*time.Second)

	ctx, endGrace := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- reg.Drain(ctx, registry.DrainGrace(time.Minute)) }()
	row := fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].find(r => r.textContent.includes(%s))`, jsString(id))
	p.waitFor(row+`?.querySelector('.badge')?.textContent === 'draining'`, 5*time.Second)
	p.waitFor(`document.querySelector('.tree .titem[aria-level="1"] .badge.draining')?.textContent === '1 draining' && document.querySelector('.stats .value.warn').textContent === '1'`, 2*time.Second)
	p.screenshot("draining")

	endGrace()
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
	p.waitFor(`!(`+row+`) && document.querySelectorAll('.grid .grow').length === 1`, 5*time.Second)
	p.click(`.tabs a[data-section="events"]`)
	p.waitFor(`(() => { const rows = [...document.querySelectorAll('.grid .grow')].map(r => r.textContent); return rows.some(t => t.includes('draining')) && rows.some(t => t.includes('left')); })()`, 5*time.Second)
}

// TestKilledRegistrantDisappearsAfterItsLease runs a registrant as a real
// child process, SIGKILLs it, and watches its instance leave the page
// when its lease (2 s) expires, not before.
func TestKilledRegistrantDisappearsAfterItsLease(t *testing.T) {
	s := startServer(t, nil)
	p := openPage(t, s.Endpoints().HTTP, "/ui/services/crash/worker/jobs")
	p.waitFor(`document.querySelector('#live').dataset.state === 'live'`, 5*time.Second)
	cmd, id := startRegistrant(t, s.Endpoints().ClientURLs)
	row := fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes(%s))`, jsString(id))
	p.waitFor(row, 2*time.Second)

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	gone := p.waitFor(`!(`+row+`)`, childTTL+5*time.Second)
	after := gone.Sub(killed)
	t.Logf("SIGKILL → gone from the page after %v (lease TTL %v)", after, childTTL)
	// The lease was renewed at most TTL/3 before the kill.
	if after < childTTL/2 || after > childTTL+2*time.Second {
		t.Errorf("gone %v after SIGKILL, want about the lease TTL (%v)", after, childTTL)
	}
	p.click(`.tabs a[data-section="events"]`)
	p.waitFor(fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes('left') && r.textContent.includes(%s))`, jsString(id)), 5*time.Second)
}

// TestUntrustedDataStaysText registers metadata made to break out of HTML
// and attribute quoting: it must show as text and run nothing.
func TestUntrustedDataStaysText(t *testing.T) {
	s := startServer(t, nil)
	evil := map[string]string{
		"<script>window.__pwned=1</script>": `"'><img src=x onerror="window.__pwned=2">`,
		"note":                              `</div><script>window.__pwned=3</script>`,
		"q\"onmouseover=window.__pwned=4":   `' onfocus='window.__pwned=5' autofocus x='`,
	}
	p := openPage(t, s.Endpoints().HTTP, "/ui/services/evil/x/y")
	p.waitFor(`document.querySelector('#live').dataset.state === 'live'`, 5*time.Second)
	reg := register(t, s.Registry(), beacon.Instance{Namespace: "evil", Component: "x", Endpoint: "y", Address: "10.6.6.6:666", Transport: "tcp", Metadata: evil})
	p.waitFor(`document.querySelectorAll('.grid .grow').length === 1`, 5*time.Second)
	p.click(`.grid .grow`)
	p.waitFor(`document.querySelector('.inspector:not([hidden]) dl')`, 2*time.Second)
	p.click(`.tabs a[data-section="events"]`)
	p.waitFor(`[...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes('joined'))`, 2*time.Second)
	p.typeText(`.toolbar input[type="search"]`, "evil/")
	p.waitFor(`document.querySelector('.toolbar .count').textContent === '1 of 2 events'`, 2*time.Second)
	p.navigate("/ui/services/evil/x/y/" + reg.Instance().ID)
	p.waitFor(`document.querySelector('.inspector:not([hidden]) dl')`, 5*time.Second)
	p.screenshot("untrusted-metadata")

	if got := eval[bool](p, `window.__pwned === undefined`); !got {
		t.Fatalf("metadata ran script: window.__pwned = %v", eval[any](p, `window.__pwned`))
	}
	if n := eval[int](p, `document.querySelectorAll('script').length`); n != 1 {
		t.Errorf("%d script elements, want the one module script", n)
	}
	if n := eval[int](p, `document.querySelectorAll('main img, main [onerror], main [onfocus], main [onmouseover], main [autofocus]').length`); n != 0 {
		t.Errorf("%d elements built from metadata markup", n)
	}
	// Every key and value is there, verbatim, as text.
	text := eval[string](p, `document.querySelector('.inspector').textContent`)
	for k, v := range evil {
		if !strings.Contains(text, k) || !strings.Contains(text, v) {
			t.Errorf("the inspector lacks %q = %q as text", k, v)
		}
	}
	meta := eval[string](p, `document.querySelector('.grid .grow .cell.meta').getAttribute('title')`)
	if !strings.Contains(meta, `"'><img src=x`) {
		t.Errorf("metadata cell title %q", meta)
	}
}

// TestInvisibleCharactersShow registers metadata and an address holding
// characters that reorder or hide text: a right-to-left override in one
// value showed the metadata after it reversed ("b=normal" as "lamron=b"),
// in the list and its tooltip. They show as ⟨U+XXXX⟩, and the text around
// them in its order; right-to-left text without controls, and the joiners
// of an emoji, show as they are.
func TestInvisibleCharactersShow(t *testing.T) {
	s := startServer(t, nil)
	reg := register(t, s.Registry(), beacon.Instance{Namespace: "bidi", Component: "c", Endpoint: "e",
		Address:  "http://10.7.0.1:80/\u202eabc",
		Metadata: map[string]string{"a": "\u202eevil", "b": "normal", "c\u200b": "x\u2066y", "d": "مرحبا", "e": "👩\u200d👩\u200d👧"}})
	p := openPage(t, s.Endpoints().HTTP, "/ui/services/bidi/c/e/"+reg.Instance().ID)
	p.waitFor(`document.querySelector('.inspector:not([hidden]) dl')`, 10*time.Second)
	p.screenshot("invisible-characters")
	meta := eval[string](p, `document.querySelector('.grid .grow .cell.meta').textContent`)
	want := "a=⟨U+202E⟩evil  b=normal  c⟨U+200B⟩=x⟨U+2066⟩y  d=مرحبا  e=👩\u200d👩\u200d👧"
	if meta != want {
		t.Errorf("metadata cell %q, want %q", meta, want)
	}
	if tip := eval[string](p, `document.querySelector('.grid .grow .cell.meta').getAttribute('title')`); tip != want {
		t.Errorf("metadata tooltip %q, want %q", tip, want)
	}
	text := eval[string](p, `document.querySelector('.inspector').textContent`)
	for _, w := range []string{"http://10.7.0.1:80/⟨U+202E⟩abc", "⟨U+202E⟩evil", "c⟨U+200B⟩", "x⟨U+2066⟩y", "مرحبا"} {
		if !strings.Contains(text, w) {
			t.Errorf("the details lack %q:\n%s", w, text)
		}
	}
	if addr := eval[string](p, `[...document.querySelectorAll('.grid .grow .cell')].map(c => c.textContent).find(t => t.startsWith('http://'))`); addr != "http://10.7.0.1:80/⟨U+202E⟩abc" {
		t.Errorf("address cell %q", addr)
	}
	// The filter still finds the raw value.
	p.typeText(`.table-tools input[type="search"]`, "normal")
	p.waitFor(`document.querySelectorAll('.grid .grow').length === 1`, 2*time.Second)
}

// TestTenThousandInstances renders 10,000 instances: all are counted, the
// DOM holds only the rows in view, a burst of 750 changes while they are
// shown reaches the page, filtering finds one, and the rows kept sorted in
// place through the burst are those of a fresh sort. How fast is
// BenchmarkTenThousandInstances's to say (goals: 2,000 ms from the
// snapshot to its paint, 250 ms for the longest frame of the burst), not
// a test's: a busy machine must pass (it failed at 4,578 ms).
func TestTenThousandInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("registers 10,000 instances")
	}
	s := startServer(t, nil)
	start := time.Now()
	registerTenThousand(t, s)
	t.Logf("registered %d instances in %v", tenThousand, time.Since(start))

	opened := time.Now()
	p := openPage(t, s.Endpoints().HTTP, "/ui/services")
	shown, snap := waitTenThousand(p)
	t.Logf("10,000 instances: navigation → shown %v; snapshot arrival → painted %.0f ms (parse+apply %.0f ms, first frame %.0f ms)",
		shown.Sub(opened), snap.ToPaintMs, snap.ParseApplyMs, snap.RenderMs)
	// Windowed: the DOM holds the rows in view, not 10,000.
	if rows := eval[int](p, `document.querySelectorAll('.grid .grow').length`); rows > 100 {
		t.Errorf("%d row elements in the DOM for 10,000 instances", rows)
	}
	p.screenshot("10k-instances")

	f := burstOverTenThousand(t, s, p)
	t.Logf("burst of 750 changes over 10,000 instances: %d frames, longest %.1f ms", f.Frames, f.MaxFrameMs)
	if f.Frames == 0 {
		t.Error("no frame rendered the burst")
	}

	// Filtering 10,000 rows answers within a frame or two.
	p.typeText(`.table-tools input`, "shard=9999")
	p.waitFor(`document.querySelector('.detail .count').textContent.startsWith('1 of')`, 5*time.Second)
	// Scrolling to the end shows the last rows.
	typeClear(p, `.table-tools input`)
	p.waitFor(`document.querySelector('.detail .count').textContent === '10,250 instances'`, 5*time.Second)
	bottom := func() string {
		eval[any](p, `(document.querySelector('.grid .scroller').scrollTop = 1e9, null)`)
		p.nextFrames(2) // the page renders what the clicks and the scroll asked for
		p.waitFor(`document.querySelector('.grid .grow:last-child')?.getAttribute('aria-rowindex') === '10251'`, 5*time.Second)
		return eval[string](p, `[...document.querySelectorAll('.grid .grow')].map(r => r.children[2].textContent + ' ' + r.children[1].textContent).join('\n')`)
	}
	// The rows kept sorted in place through the burst are the rows of a
	// fresh sort (clicking the column header twice rebuilds the list).
	kept := bottom()
	for _, dir := range []string{"descending", "ascending"} {
		p.click(`.grid .ghead [role="columnheader"]:nth-child(3) button`)
		p.waitFor(fmt.Sprintf(`[...document.querySelectorAll('.grid .ghead [role="columnheader"]')].some(h => h.textContent.startsWith('Address') && h.getAttribute('aria-sort') === %q)`, dir), 2*time.Second)
	}
	if fresh := bottom(); fresh != kept {
		t.Errorf("rows after the burst differ from a fresh sort:\nkept:\n%s\nfresh:\n%s", kept, fresh)
	}
	if !strings.Contains(kept, "10.200.1.243:80") {
		t.Errorf("the last rows lack the last burst instance:\n%s", kept)
	}
}

// BenchmarkTenThousandInstances measures what TestTenThousandInstances
// checks works, in headless Chromium: per iteration the page is loaded
// with 10,000 instances and the time from the snapshot's arrival to its
// paint is read from the page; after the loop, the longest frame of a
// burst of 750 changes. It reports the medians and their ratios to the
// goals (paint/goal, frame/goal: at most 1).
//
//	go test -run '^$' -bench TenThousand -benchtime 5x ./server/ui/
func BenchmarkTenThousandInstances(b *testing.B) {
	const paintGoal, frameGoal = 2000.0, 250.0 // ms
	s := startServer(b, nil)
	registerTenThousand(b, s)
	p := newTab(b, s.Endpoints().HTTP)
	var paint []float64
	for b.Loop() {
		p.navigate("/ui/services")
		_, snap := waitTenThousand(p)
		paint = append(paint, snap.ToPaintMs)
	}
	f := burstOverTenThousand(b, s, p)
	slices.Sort(paint)
	b.ReportMetric(paint[len(paint)/2], "paint-ms")
	b.ReportMetric(paint[len(paint)/2]/paintGoal, "paint/goal")
	b.ReportMetric(f.MaxFrameMs, "burst-max-frame-ms")
	b.ReportMetric(f.MaxFrameMs/frameGoal, "frame/goal")
}

const tenThousand = 10000

// registerTenThousand registers the 10,000 instances of the scale test and
// benchmark.
func registerTenThousand(tb testing.TB, s *server.Server) {
	tb.Helper()
	registerMany(tb, s.Registry(), tenThousand, func(i int) beacon.Instance {
		return beacon.Instance{
			Namespace: fmt.Sprintf("ns%d", i%5), Component: fmt.Sprintf("comp%d", i%20), Endpoint: fmt.Sprintf("ep%d", i%3),
			Address: fmt.Sprintf("10.%d.%d.%d:8080", i/65536, i/256%256, i%256), Transport: "grpc",
			Metadata: map[string]string{"zone": fmt.Sprintf("z%d", i%4), "shard": fmt.Sprint(i)},
		}
	})
}

// paintStats is what the page measured of its first snapshot
// (window.beacon.stats.snapshots[0]).
type paintStats struct {
	Instances    int     `json:"instances"`
	ParseApplyMs float64 `json:"parseApplyMs"`
	RenderMs     float64 `json:"renderMs"`
	ToPaintMs    float64 `json:"toPaintMs"`
}

// waitTenThousand waits until p shows the 10,000 instances, and returns
// the page's clock then and its measures of the snapshot, which must have
// held all of them.
func waitTenThousand(p *page) (time.Time, paintStats) {
	p.t.Helper()
	shown := p.waitFor(`document.querySelector('.detail .count').textContent === '10,000 instances' && document.querySelectorAll('.grid .grow').length > 10`, 30*time.Second)
	p.waitFor(`window.beacon.stats.snapshots.length > 0`, 5*time.Second)
	snap := eval[paintStats](p, `window.beacon.stats.snapshots[0]`)
	if snap.Instances != tenThousand {
		p.t.Fatalf("the snapshot had %d instances", snap.Instances)
	}
	return shown, snap
}

// frameStats is what the page measured of its frames since they were
// reset.
type frameStats struct {
	Frames     int     `json:"frames"`
	MaxFrameMs float64 `json:"maxFrameMs"`
}

// burstOverTenThousand registers 500 more instances while p shows the
// 10,000, then closes 250 of them, waits until the page counts each step,
// and returns the page's frames meanwhile.
func burstOverTenThousand(tb testing.TB, s *server.Server, p *page) frameStats {
	tb.Helper()
	eval[any](p, `(window.beacon.stats.maxFrameMs = 0, window.beacon.stats.frames = 0, null)`)
	regs := registerMany(tb, s.Registry(), 500, func(i int) beacon.Instance {
		return beacon.Instance{Namespace: "burst", Component: "c", Endpoint: "e", Address: fmt.Sprintf("10.200.%d.%d:80", i/256, i%256)}
	})
	p.waitFor(`document.querySelector('.detail .count').textContent === '10,500 instances'`, 10*time.Second)
	var wg sync.WaitGroup
	for _, r := range regs[:250] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.Close()
		}()
	}
	wg.Wait()
	p.waitFor(`document.querySelector('.detail .count').textContent === '10,250 instances'`, 10*time.Second)
	return eval[frameStats](p, `window.beacon.stats`)
}

// demoFleet is a small, plausible registry for the screenshots.
func demoFleet() []beacon.Instance {
	var out []beacon.Instance
	add := func(ns, comp, ep, transport string, n int, port int, md func(i int) map[string]string) {
		for i := range n {
			out = append(out, beacon.Instance{Namespace: ns, Component: comp, Endpoint: ep, Transport: transport,
				Address: fmt.Sprintf("10.%d.%d.%d:%d", len(ns), len(comp), 11+i, port), Metadata: md(i)})
		}
	}
	zone := func(i int) map[string]string {
		return map[string]string{"zone": []string{"eu-west-1a", "eu-west-1b", "eu-west-1c"}[i%3], "version": "2.14." + fmt.Sprint(3+i%2)}
	}
	add("payments", "api", "grpc", "grpc", 4, 50051, zone)
	add("search", "query", "http", "http", 6, 8080, func(i int) map[string]string {
		return map[string]string{"zone": []string{"eu-west-1a", "eu-west-1b"}[i%2], "shard": fmt.Sprint(i % 3), "weight": "100"}
	})
	add("demo", "web", "http", "http", 3, 8080, zone)
	add("payments", "ledger", "grpc", "grpc", 2, 50052, zone)
	add("search", "indexer", "jobs", "nats", 3, 4222, func(i int) map[string]string { return map[string]string{"queue": "index." + fmt.Sprint(i)} })
	add("payments", "webhooks", "http", "http", 2, 8443, zone)
	return out
}

func registerMany(t testing.TB, r registry.Registrar, n int, mk func(int) beacon.Instance) []registry.Registration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := make([]registry.Registration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				reg, err := r.Register(ctx, mk(i))
				if err != nil {
					errs <- err
					continue
				}
				out[i] = reg
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("register: %v", err)
	}
	return out
}

func typeClear(p *page, sel string) {
	p.t.Helper()
	eval[any](p, fmt.Sprintf(`(() => { const el = document.querySelector(%s); el.value = ''; el.dispatchEvent(new Event('input', {bubbles: true})); return null; })()`, jsString(sel)))
}

// TestPagesWithoutEtcd serves the dashboard over the memory backend: the
// Cluster page shows the backend's health and no members, the Bootstrap
// page says tokens need etcd, and the Services page works as with etcd.
func TestPagesWithoutEtcd(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.Backend = backend.Config{Name: backend.Memory} })
	register(t, s.Registry(), beacon.Instance{Namespace: "mem", Component: "c", Endpoint: "e", Address: "10.5.0.1:80"})
	p := openPage(t, s.Endpoints().HTTP, "/ui/cluster")
	p.waitFor(`document.querySelector('.cards')?.textContent.includes('memory') && document.querySelector('.badge.ok')?.textContent === 'healthy' && document.querySelector('.page-body').textContent.includes('no etcd members')`, 10*time.Second)
	p.screenshot("cluster-memory")
	p.click(`.tabs a[data-section="bootstrap"]`)
	p.waitFor(`document.querySelector('.empty h2')?.textContent === 'No discovery tokens on this server'`, 5*time.Second)
	p.click(`.tabs a[data-section="services"]`)
	p.waitFor(`document.querySelector('.detail .count').textContent === '1 instance'`, 5*time.Second)
}

// TestDeepLinkBeforeTheSnapshot opens a link to one instance while the
// page's watch stream is held back (Chromium pauses the request): until
// the snapshot arrives the details say they are loading, not that the
// instance is not registered; then they show it. A link to an instance
// that is really absent says so once the snapshot is in.
func TestDeepLinkBeforeTheSnapshot(t *testing.T) {
	s := startServer(t, nil)
	reg := register(t, s.Registry(), beacon.Instance{Namespace: "shop", Component: "cart", Endpoint: "http", Address: "10.2.0.9:8080"})
	id := reg.Instance().ID
	p := newTab(t, s.Endpoints().HTTP)
	held := chromedp.Events(p.ctx, fetch.RequestPaused)
	err := chromedp.Do(p.ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/v1/registry/watch*"}}})
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	p.navigate("/ui/services/shop/cart/http/" + id)
	inspector := `document.querySelector('.inspector')`
	p.waitFor(inspector+`.textContent.includes('Loading instance shop/cart/http/`+id+`')`, 10*time.Second)
	var watch fetch.RequestID
	for ev, err := range held {
		if err != nil {
			t.Fatal(err)
		}
		watch = ev.RequestID
		break
	}
	p.nextFrames(3) // the page renders while it waits, and says nothing false
	if text := eval[string](p, inspector+`.textContent`); strings.Contains(text, "not registered") {
		t.Fatalf("before the snapshot, the details say %q", text)
	}
	p.screenshot("deep-link-loading")
	err = chromedp.Do(p.ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tg, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: watch}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tg, fetch.Disable, cdp.Empty{})
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	p.waitFor(inspector+`.textContent.includes('10.2.0.9:8080')`, 10*time.Second)

	// An absent instance: "not registered", once the page knows.
	p.navigate("/ui/services/shop/cart/http/00000000000000ff")
	p.waitFor(inspector+`.textContent.includes('Instance shop/cart/http/00000000000000ff is not registered.')`, 10*time.Second)
}
