package ui_test

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/beaconplane/beacon/server/ui"
)

// stallProxy forwards TCP connections to a server until stall is called;
// then it forwards nothing in either direction, as a hung network path or
// a frozen server would, and the connections stay open. resume drops the
// connections of the stall and forwards new ones again.
type stallProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	gate   chan struct{} // closed while traffic flows
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, gate: make(chan struct{}), conns: map[net.Conn]bool{}}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// pipe copies src to dst, holding every chunk while the proxy stalls.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
}

func (p *stallProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	close(p.gate)
}

func (p *stallProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// TestDeadStreamReconnectsAndNeverFreezes cuts the page's event stream
// without closing it (a hung path): the page notices the silence within
// its bound, says so in a banner, stays usable meanwhile, and once the
// path is back resumes the watch with Last-Event-ID, showing what changed
// during the cut without a fresh snapshot.
func TestDeadStreamReconnectsAndNeverFreezes(t *testing.T) {
	const (
		silence   = 1500 * time.Millisecond
		keepAlive = 200 * time.Millisecond
	)
	var mu sync.Mutex
	var resumedFrom []string
	srv, reg := startHandlers(t, ui.Config{StreamSilence: silence}, registryapi.Config{KeepAliveInterval: keepAlive},
		func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == registryapi.WatchPath {
					mu.Lock()
					resumedFrom = append(resumedFrom, r.Header.Get("Last-Event-ID"))
					mu.Unlock()
				}
				next.ServeHTTP(w, r)
			})
		})
	proxy := newStallProxy(t, srv.Listener.Addr().String())

	register(t, reg, beacon.Instance{Namespace: "demo", Component: "web", Endpoint: "http", Address: "10.3.0.1:8080"})
	p := openHandlersPage(t, "http://"+proxy.addr(), "/ui/services/demo/web/http")
	// Chromium logs the requests that the cut makes fail.
	p.allowConsole(`Failed to load resource|net::ERR_`)
	p.waitFor(`document.querySelector('#live').dataset.state === 'live' && document.querySelectorAll('.grid .grow').length === 1`, 5*time.Second)
	rev := eval[float64](p, `window.beacon.model.revision`)

	proxy.stall()
	stalled := time.Now()
	b := register(t, reg, beacon.Instance{Namespace: "demo", Component: "web", Endpoint: "http", Address: "10.3.0.2:8080"})
	shown := p.waitFor(`!document.querySelector('#banner').hidden && document.querySelector('#banner').textContent.includes('Lost the live event stream')`, silence+3*time.Second)
	t.Logf("stream cut → banner after %v (silence bound %v)", shown.Sub(stalled), silence)
	// The last byte before the cut (a keep-alive, every 200 ms unless the
	// machine is loaded) started the silence.
	if d := shown.Sub(stalled); d < silence/2 {
		t.Errorf("banner after %v, before the silence bound %v", d, silence)
	}
	if n := eval[int](p, `document.querySelectorAll('.grid .grow').length`); n != 1 {
		t.Errorf("%d instances shown while the stream is cut, want the 1 known", n)
	}
	p.screenshot("stream-lost")

	// The page stays usable: navigation and filtering answer at once.
	clicked := time.Now()
	p.click(`.tabs a[data-section="events"]`)
	p.typeText(`.toolbar input[type="search"]`, "lost")
	answered := p.waitFor(`location.pathname === '/ui/events' && [...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes('lost the watch stream'))`, 2*time.Second)
	t.Logf("while the stream is dead: navigation and filtering answered in %v", answered.Sub(clicked))

	proxy.resume()
	p.click(`.tabs a[data-section="services"]`)
	// Reconnect now, if the page has not reconnected on its own already:
	// checked and clicked in one step, since a separate check raced with the
	// page hiding the button (the click then waited for it until the
	// test's deadline).
	eval[bool](p, `(() => { const b = document.querySelector('#banner button'); if (b && !b.hidden && !document.querySelector('#banner').hidden) { b.click(); return true } return false })()`)
	p.waitFor(fmt.Sprintf(`document.querySelector('#live').dataset.state === 'live' && [...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes(%s))`, jsString(b.Instance().ID)), 20*time.Second)
	p.waitFor(`document.querySelector('#banner').hidden`, time.Second)
	// Resumed from where it stopped: B came as a change, not in a snapshot.
	if eval[bool](p, `window.beacon.model.events.some(e => e.detail && e.detail.startsWith('re-listed'))`) {
		t.Errorf("the page re-listed instead of resuming")
	}
	mu.Lock()
	defer mu.Unlock()
	last := resumedFrom[len(resumedFrom)-1]
	if len(resumedFrom) < 2 || last != fmt.Sprint(int64(rev)) {
		t.Errorf("watch requests carried Last-Event-ID %q, want the last one to resume from %v", resumedFrom, rev)
	}
}

// TestBackendLossShowsStale fronts a real etcd that stops under the page:
// the server's watch turns stale, the page says the server lost its
// backend (and keeps what it shows), and once etcd is back the page is live
// again and follows new registrations.
func TestBackendLossShowsStale(t *testing.T) {
	etcd := etcdtest.Start(t, etcdtest.Options{})
	s := startServer(t, func(c *server.Config) { c.EtcdEndpoints = etcd.Endpoints() })
	register(t, s.Registry(), beacon.Instance{Namespace: "ops", Component: "db", Endpoint: "sql", Address: "10.7.0.1:5432"})
	p := openPage(t, s.Endpoints().HTTP, "/ui/services/ops/db/sql")
	p.waitFor(`document.querySelector('#live').dataset.state === 'live' && document.querySelectorAll('.grid .grow').length === 1`, 5*time.Second)

	stopped := time.Now()
	etcd.Stop()
	shown := p.waitFor(`document.querySelector('#live').dataset.state === 'stale' && document.querySelector('#banner').textContent.includes('lost its connection to the registry backend')`, 20*time.Second)
	t.Logf("etcd stopped → stale banner after %v", shown.Sub(stopped))
	if n := eval[int](p, `document.querySelectorAll('.grid .grow').length`); n != 1 {
		t.Errorf("%d instances shown while the backend is away, want the 1 known (never blanked)", n)
	}
	p.screenshot("backend-stale")

	if err := etcd.Restart(); err != nil {
		t.Fatal(err)
	}
	p.waitFor(`document.querySelector('#live').dataset.state === 'live' && document.querySelector('#banner').hidden`, 30*time.Second)
	reg := register(t, s.Registry(), beacon.Instance{Namespace: "ops", Component: "db", Endpoint: "sql", Address: "10.7.0.2:5432"})
	p.waitFor(fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes(%s))`, jsString(reg.Instance().ID)), 5*time.Second)
}
