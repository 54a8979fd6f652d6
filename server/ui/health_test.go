package ui_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/healthtest"
	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/beaconplane/beacon/server/ui"
	"github.com/beaconplane/beacon/store/memory"
)

// TestHealthShowsLive: the instances page shows each instance's verdict in
// its Health column, marks a failing row and counts it (card, tree), shows
// a service in panic, and follows a change of verdict alone, live; the
// timeline logs it.
func TestHealthShowsLive(t *testing.T) {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	srv, reg := startHandlersOn(t, st, ui.Config{}, registryapi.Config{}, nil)
	put := func(ins ...beacon.Instance) { t.Helper(); healthtest.PutAll(t, st, reg.Keyspace(), ins...) }
	at := func(id, addr string) beacon.Instance {
		return beacon.Instance{Namespace: "shop", Component: "cart", Endpoint: "http", ID: id, Address: addr, Transport: "http",
			Status: beacon.StatusServing, RegisteredAt: time.Now().UTC()}
	}
	a, b, c := at("00000000000000c1", "10.3.0.1:8080"), at("00000000000000c2", "10.3.0.2:8080"), at("00000000000000c3", "10.3.0.3:8080")
	put(healthtest.Passing(a), healthtest.Passing(b), c)

	p := openHandlersPage(t, srv.URL, "/ui/services/shop/cart/http")
	cell := func(id string) string {
		return fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].find(r => r.textContent.includes(%s))?.querySelector('.cell:nth-child(5) .badge')`, jsString(id))
	}
	row := func(id string) string {
		return fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].find(r => r.textContent.includes(%s))`, jsString(id))
	}
	p.waitFor(`document.querySelectorAll('.grid .grow').length === 3 && [...document.querySelectorAll('.grid .ghead [role="columnheader"]')].some(h => h.textContent === 'Health')`, 5*time.Second)
	p.waitFor(cell(a.ID)+`?.textContent === 'passing' && `+cell(c.ID)+`?.textContent === '–' && !`+row(a.ID)+`.classList.contains('failing')`, 2*time.Second)

	start := time.Now()
	put(healthtest.Failing(b, "dial tcp 10.3.0.2:8080: connection refused"))
	seen := p.waitFor(cell(b.ID)+`?.textContent === 'failing' && `+cell(b.ID)+`.classList.contains('bad') && `+row(b.ID)+`.classList.contains('failing')`, 5*time.Second)
	t.Logf("a failing verdict shown %v after it was written", seen.Sub(start))
	p.waitFor(`document.querySelector('.stats .value.failing.bad')?.textContent === '1' && document.querySelector('.tree .titem[aria-level="1"] .badge.bad')?.textContent === '1 failing'`, 2*time.Second)
	p.screenshot("health-failing")

	// The details say why.
	eval[any](p, `(`+row(b.ID)+`.click(), null)`)
	p.waitFor(`!document.querySelector('.inspector').hidden && document.querySelector('.inspector').textContent.includes('dial tcp 10.3.0.2:8080: connection refused') && document.querySelector('.inspector').textContent.includes('tcp every 10s')`, 2*time.Second)

	// Most of the service failing: panic, shown, and no row marked.
	put(healthtest.Panic(a, "timeout"), healthtest.Panic(b, "timeout"))
	p.waitFor(cell(a.ID)+`?.textContent === 'failing (panic)' && `+cell(b.ID)+`?.textContent === 'failing (panic)' && !`+row(b.ID)+`.classList.contains('failing') && document.querySelector('.stats .value.failing').textContent === '0' && !document.querySelector('.stats .value.failing.bad')`, 5*time.Second)
	put(healthtest.Passing(a), healthtest.Passing(b))
	p.waitFor(cell(b.ID)+`?.textContent === 'passing'`, 5*time.Second)

	p.click(`.tabs a[data-section="events"]`)
	p.waitFor(fmt.Sprintf(`(() => { const rows = [...document.querySelectorAll('.grid .grow')].filter(r => r.textContent.includes(%s)).map(r => r.textContent); return rows.some(t => t.includes('failing') && t.includes('health passing → failing: dial tcp')) && rows.some(t => t.includes('routed again')); })()`, jsString(b.ID)), 5*time.Second)
}
