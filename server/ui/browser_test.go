package ui_test

// The dashboard's tests drive a real headless Chromium (Debian's chromium,
// found through internal/testkit/testpeer) with chromedp against a real `beacon
// serve` (embedded etcd) or the real HTTP handlers. This file holds the
// harness: one browser per test process, one tab per test, the page's
// console and exceptions captured, waits that run inside the page on DOM
// mutations and animation frames (never a sleep), and screenshots saved
// as artifacts.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
)

// ArtifactsEnv names the directory where the tests save screenshots; a new
// temporary directory when unset. The tests log where they write, and
// .ci/run prints it.
const ArtifactsEnv = "BEACON_UI_ARTIFACTS"

var (
	browserOnce sync.Once
	browserCtx  context.Context
	browserStop = func() {}
	browserErr  error

	artifactsOnce sync.Once
	artifactsDir  string
	artifactsErr  error
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	code := m.Run()
	browserStop()
	if artifactsDir != "" {
		fmt.Printf("dashboard screenshots are in %s\n", artifactsDir)
	}
	os.Exit(code)
}

// chromiumFlags are the flags that work on a closed network (no background
// connections to Google's services) as root in a container.
func chromiumFlags(exe, profile string) []chromedp.ExecAllocatorOption {
	return []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.UserDataDir(profile),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-features", "Translate,MediaRouter,OptimizationHints,AutofillServerCommunication,CertificateTransparencyComponentUpdater"),
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("disable-backgrounding-occluded-windows", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("no-pings", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.Flag("use-mock-keychain", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.WindowSize(1400, 860),
	}
}

// browser starts Chromium once per test process.
func browser(t testing.TB) context.Context {
	t.Helper()
	exe := testpeer.Binary(t, "apt-get install chromium", "chromium", "chromium-browser", "google-chrome-stable", "google-chrome")
	browserOnce.Do(func() {
		profile, err := os.MkdirTemp("", "beacon-chromium-profile-")
		if err != nil {
			browserErr = err
			return
		}
		allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromiumFlags(exe, profile)...)
		ctx, cancel := chromedp.NewContext(allocCtx)
		browserStop = func() {
			cancel()
			cancelAlloc()
			_ = os.RemoveAll(profile)
		}
		// The first action starts the browser, which lives as long as the
		// context of that action: this one, not one with a timeout.
		if err := chromedp.Do(ctx); err != nil {
			browserErr = fmt.Errorf("start %s: %w", exe, err)
			return
		}
		browserCtx = ctx
	})
	if browserErr != nil {
		t.Fatal(browserErr)
	}
	return browserCtx
}

func artifacts(t testing.TB) string {
	t.Helper()
	artifactsOnce.Do(func() {
		if d := os.Getenv(ArtifactsEnv); d != "" {
			artifactsDir, artifactsErr = d, os.MkdirAll(d, 0o755)
			return
		}
		artifactsDir, artifactsErr = os.MkdirTemp("", "beacon-ui-artifacts-")
	})
	if artifactsErr != nil {
		t.Fatal(artifactsErr)
	}
	return artifactsDir
}

// page is one browser tab.
type page struct {
	t     testing.TB
	ctx   context.Context
	base  string
	mu    sync.Mutex
	msgs  []chromedp.ConsoleMessage
	allow []*regexp.Regexp
}

// openPage opens a tab on base+path and waits until the dashboard runs.
// At the end of the test it fails the test for any console error or
// uncaught exception the page produced (see allowConsole).
func openPage(t testing.TB, base, path string) *page {
	t.Helper()
	p := newTab(t, base)
	p.navigate(path)
	return p
}

// newTab opens a tab in a browser context of its own (its own cookies and
// HTTP authentication cache), on nothing yet.
func newTab(t testing.TB, base string) *page {
	t.Helper()
	tab, closeTab := chromedp.NewContext(browser(t), chromedp.WithNewBrowserContext())
	t.Cleanup(closeTab)
	ctx, cancel := context.WithTimeout(tab, 3*time.Minute)
	t.Cleanup(cancel)
	p := &page{t: t, ctx: ctx, base: base}
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			p.mu.Lock()
			p.msgs = append(p.msgs, m)
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.checkConsole)
	return p
}

func (p *page) navigate(path string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.Navigate(p.base+path)); err != nil {
		p.t.Fatalf("navigate to %s: %v", path, err)
	}
	p.waitFor(`window.beacon && document.querySelector('main > *:not(.loading)')`, 10*time.Second)
}

// allowConsole lets console errors whose text and URL match re pass (a
// test that cuts the network expects the browser to log failed requests).
func (p *page) allowConsole(re string) {
	p.mu.Lock()
	p.allow = append(p.allow, regexp.MustCompile(re))
	p.mu.Unlock()
}

func (p *page) checkConsole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.msgs {
		if m.Type != chromedp.ConsoleError && m.Type != chromedp.ConsoleException {
			if m.Type == chromedp.ConsoleWarning {
				p.t.Logf("console warning: %s (%s:%d)", m.Text, m.URL, m.Line)
			}
			continue
		}
		allowed := false
		for _, re := range p.allow {
			allowed = allowed || re.MatchString(m.Text+" "+m.URL)
		}
		if allowed {
			p.t.Logf("console (expected): %s", m)
			continue
		}
		p.t.Errorf("console %s: %s (%s:%d)", m.Type, m.Text, m.URL, m.Line)
	}
}

// eval evaluates a JavaScript expression and decodes its JSON value.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		p.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor waits, inside the page, until the JavaScript expression cond is
// truthy: it is checked on every DOM mutation and every animation frame,
// and the page's clock (Date.now) at that moment is returned.
func (p *page) waitFor(cond string, timeout time.Duration) time.Time {
	p.t.Helper()
	at, err := p.tryWaitFor(cond, timeout)
	if err != nil {
		p.screenshot("failed-" + sanitize(p.t.Name()))
		p.t.Fatal(err)
	}
	return at
}

func (p *page) tryWaitFor(cond string, timeout time.Duration) (time.Time, error) {
	condJSON, _ := json.Marshal(cond)
	js := fmt.Sprintf(`new Promise((resolve, reject) => {
  const test = () => { try { return !!(%s); } catch (e) { return false; } };
  if (test()) { resolve(Date.now()); return; }
  let raf = 0;
  const mo = new MutationObserver(() => { if (test()) finish(true); });
  const timer = setTimeout(() => finish(test()), %d);
  function finish(ok) {
    mo.disconnect(); cancelAnimationFrame(raf); clearTimeout(timer);
    if (ok) resolve(Date.now()); else reject(new Error('not true within %v: ' + %s));
  }
  const frame = () => { if (test()) finish(true); else raf = requestAnimationFrame(frame); };
  mo.observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
  raf = requestAnimationFrame(frame);
})`, cond, timeout.Milliseconds(), timeout, condJSON)
	ms, err := chromedp.Run(p.ctx, chromedp.Evaluate[float64](js, chromedp.EvalAwaitPromise))
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(int64(ms)), nil
}

// nextFrames waits until the page has rendered n more animation frames.
func (p *page) nextFrames(n int) {
	p.t.Helper()
	eval[any](p, fmt.Sprintf(`new Promise(resolve => { let n = %d; const f = () => (--n <= 0 ? resolve(null) : requestAnimationFrame(f)); requestAnimationFrame(f); })`, n))
}

func (p *page) click(sel string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.Click(sel, chromedp.NodeVisible)); err != nil {
		p.t.Fatalf("click %s: %v", sel, err)
	}
}

func (p *page) typeText(sel, text string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.SendKeys(sel, text, chromedp.NodeVisible)); err != nil {
		p.t.Fatalf("type into %s: %v", sel, err)
	}
}

func (p *page) keys(keys string) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, chromedp.KeyEvent(keys)); err != nil {
		p.t.Fatalf("keys %q: %v", keys, err)
	}
}

// pressSlash types "/" as a person does: one keydown carrying the text,
// so that a page that handles the keydown (and prevents its default) gets
// no character typed (chromedp's KeyEvent sends the character as an
// event of its own, which preventDefault cannot stop).
func (p *page) pressSlash() {
	p.t.Helper()
	err := chromedp.Do(p.ctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeKeyDown, input.DispatchKeyEventTypeKeyUp} {
			ev := input.DispatchKeyEventParams{Type: typ, Key: "/", Code: "Slash", WindowsVirtualKeyCode: 191, NativeVirtualKeyCode: 191}
			if typ == input.DispatchKeyEventTypeKeyDown {
				ev.Text, ev.UnmodifiedText = "/", "/"
			}
			if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, ev); err != nil {
				return err
			}
		}
		return nil
	}))
	if err != nil {
		p.t.Fatal(err)
	}
}

// screenshot saves the viewport as <artifacts>/<name>.png.
func (p *page) screenshot(name string) string {
	p.t.Helper()
	png, err := chromedp.Run(p.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return ""
	}
	path := filepath.Join(artifacts(p.t), name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot: %s", path)
	return path
}

// colorScheme emulates prefers-color-scheme (light or dark).
func (p *page) colorScheme(scheme string) {
	p.t.Helper()
	err := chromedp.Do(p.ctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
		})
		return err
	}))
	if err != nil {
		p.t.Fatal(err)
	}
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '_'
	}, s)
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// startServer runs `beacon serve` with embedded etcd on free ports.
func startServer(t testing.TB, mutate func(*server.Config)) *server.Server {
	t.Helper()
	port := func() int {
		p, err := etcdtest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := server.Config{
		DataDir:          t.TempDir(),
		ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", port())},
		ListenPeerURLs:   []string{fmt.Sprintf("http://127.0.0.1:%d", port())},
		HTTPAddr:         "127.0.0.1:0",
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func register(t *testing.T, r registry.Registrar, in beacon.Instance) registry.Registration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := r.Register(ctx, in)
	if err != nil {
		t.Fatalf("register %+v: %v", in, err)
	}
	return reg
}

// The SIGKILL test's registrant is this test binary, re-executed with
// childEnv set: it registers one instance with a short lease TTL, prints
// "ready <id>" and keeps the lease alive until it is killed (or its stdin
// closes, so that it never outlives the test).
const (
	childEnv          = "BEACON_UI_TEST_CHILD"
	childEndpointsEnv = "BEACON_UI_TEST_CHILD_ENDPOINTS"
	childTTL          = 2 * time.Second
)

func runChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: strings.Split(os.Getenv(childEndpointsEnv), ",")})
	if err != nil {
		return fail(err)
	}
	r, err := registry.New(st, registry.Config{LeaseTTL: childTTL})
	if err != nil {
		return fail(err)
	}
	reg, err := r.Register(ctx, beacon.Instance{Namespace: "crash", Component: "worker", Endpoint: "jobs", Address: "10.9.0.1:9000", Transport: "tcp"})
	if err != nil {
		return fail(err)
	}
	fmt.Println("ready", reg.Instance().ID)
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = r.Close()
	_ = st.Close()
	return 0
}

// startRegistrant starts the child registrant against endpoints and
// returns its process and the ID it registered.
func startRegistrant(t *testing.T, endpoints []string) (*exec.Cmd, string) {
	t.Helper()
	cmd := testpeer.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childEndpointsEnv+"="+strings.Join(endpoints, ","))
	cmd.Stderr = os.Stderr
	stdin, out := testpeer.StartPiped(t, cmd)
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				lines <- id
			}
		}
		close(lines)
	}()
	select {
	case id, ok := <-lines:
		if !ok {
			t.Fatal("the registrant exited before it registered")
		}
		return cmd, id
	case <-time.After(30 * time.Second):
		t.Fatal("the registrant did not register within 30 s")
	}
	return nil, ""
}
