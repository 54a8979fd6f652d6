package ui_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// focusedJS describes the focused element for the focus-order checks.
const focusedJS = `(() => {
  const e = document.activeElement;
  if (!e || e === document.body) return 'body';
  const label = e.getAttribute('aria-label') || (e.labels && e.labels[0] && e.labels[0].textContent) || e.textContent.trim().slice(0, 30);
  return (e.getAttribute('role') || e.tagName.toLowerCase()) + ':' + label;
})()`

// TestKeyboardAndLabels walks the Services page with the keyboard only
// (focus order, the tree's and the grid's arrow keys, Enter, Escape, the
// / shortcut) and checks Chromium's accessibility tree: landmarks, and a
// name for every control.
func TestKeyboardAndLabels(t *testing.T) {
	s := startServer(t, nil)
	for _, in := range []beacon.Instance{
		{Namespace: "demo", Component: "api", Endpoint: "grpc", Address: "10.4.0.1:50051", Transport: "grpc"},
		{Namespace: "demo", Component: "web", Endpoint: "http", Address: "10.4.0.2:8080", Transport: "http"},
		{Namespace: "shop", Component: "cart", Endpoint: "http", Address: "10.4.0.3:8080", Transport: "http"},
	} {
		register(t, s.Registry(), in)
	}
	p := openPage(t, s.Endpoints().HTTP, "/ui/services")
	p.waitFor(`document.querySelector('.detail .count').textContent === '3 instances'`, 5*time.Second)

	// Focus order from the top of the page.
	want := []string{
		"a:Skip to content", "a:Beacon, services", "a:Services", "a:Events", "a:Cluster", "a:Bootstrap",
		"input:Filter services by name", "select:Which services to show", "a:All services 3", "tree:Services",
		"input:Filter instances",
	}
	var got []string
	for range want {
		p.keys("\t")
		got = append(got, eval[string](p, focusedJS))
	}
	if strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Errorf("focus order:\n got  %q\n want %q", got, want)
	}

	// The tree: arrows move, Enter opens, Left/Right fold.
	p.click(`.tree`)
	eval[any](p, `(document.querySelector('.tree').focus(), null)`)
	active := `document.getElementById(document.querySelector('.tree').getAttribute('aria-activedescendant'))`
	p.keys(kbHome)
	p.waitFor(active+`?.querySelector('.name').textContent === 'demo'`, time.Second)
	p.keys(kbDown + kbDown)
	p.waitFor(active+`?.querySelector('.name').textContent === 'grpc' && `+active+`.getAttribute('aria-level') === '3'`, time.Second)
	p.keys("\r")
	p.waitFor(`location.pathname === '/ui/services/demo/api/grpc' && document.querySelector('.detail h1').textContent === 'grpc'`, 2*time.Second)
	p.waitFor(`document.querySelector('.tree [aria-selected="true"] .name')?.textContent === 'grpc' && document.activeElement === document.querySelector('.tree')`, time.Second)
	p.keys(kbLeft) // to the parent (api)
	p.waitFor(active+`?.querySelector('.name').textContent === 'api'`, time.Second)
	p.keys(kbLeft) // fold api
	p.waitFor(active+`?.getAttribute('aria-expanded') === 'false' && document.querySelectorAll('.tree .titem').length === 7`, time.Second)
	p.keys(kbRight) // unfold
	p.waitFor(active+`?.getAttribute('aria-expanded') === 'true' && document.querySelectorAll('.tree .titem').length === 8`, time.Second)
	p.keys("sh") // type-ahead
	p.waitFor(active+`?.querySelector('.name').textContent === 'shop'`, time.Second)

	// The grid: Tab in, arrows, Enter inspects, Escape closes.
	p.keys("\t") // instance filter
	for range 20 {
		if eval[bool](p, `document.activeElement.getAttribute('role') === 'grid'`) {
			break
		}
		p.keys("\t")
	}
	p.keys(kbDown)
	p.waitFor(`document.querySelector('.grid').getAttribute('aria-activedescendant')`, time.Second)
	p.keys("\r")
	p.waitFor(`!document.querySelector('.inspector').hidden && document.querySelector('.inspector h2').textContent.startsWith('demo/api/grpc/')`, time.Second)
	p.keys(kbEscape)
	p.waitFor(`document.querySelector('.inspector').hidden`, time.Second)

	// "/" jumps to the page's search field.
	eval[any](p, `(document.activeElement.blur(), null)`)
	p.pressSlash()
	p.waitFor(`document.activeElement === document.querySelector('[data-search]')`, time.Second)
	p.keys("shop")
	p.waitFor(`document.querySelectorAll('.tree .titem').length === 3 && location.search === '?q=shop'`, time.Second)
	p.screenshot("keyboard")

	// Chromium's accessibility tree: landmarks, and a name for every control.
	nodes, err := chromedp.Run(p.ctx, chromedp.Action[[]*accessibility.Node](func(ctx context.Context, tg *chromedp.Target) ([]*accessibility.Node, error) {
		res, err := cdp.Call(ctx, tg, accessibility.GetFullAXTree, accessibility.GetFullAXTreeParams{})
		if err != nil {
			return nil, err
		}
		return res.Nodes, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	needName := map[string]bool{"button": true, "link": true, "textbox": true, "searchbox": true, "combobox": true, "tree": true,
		"treeitem": true, "grid": true, "navigation": true, "img": true, "image": true, "region": true, "complementary": true, "table": true}
	roles := map[string]int{}
	for _, n := range nodes {
		if n.Ignored || n.Role == nil {
			continue
		}
		role := axString(n.Role)
		roles[role]++
		if needName[role] && strings.TrimSpace(axString(n.Name)) == "" {
			t.Errorf("a %s without an accessible name (node %s)", role, n.NodeID)
		}
	}
	for _, r := range []string{"banner", "navigation", "main", "tree", "treeitem", "grid", "row", "columnheader", "gridcell", "searchbox"} {
		if roles[r] == 0 {
			t.Errorf("no %s in the accessibility tree (roles: %v)", r, roles)
		}
	}
	t.Logf("accessibility tree roles: %v", roles)
}

func axString(v *accessibility.Value) string {
	if v == nil || v.Value == nil {
		return ""
	}
	return strings.Trim(fmt.Sprint(string(v.Value)), `"`)
}

const (
	kbDown   = kb.ArrowDown
	kbLeft   = kb.ArrowLeft
	kbRight  = kb.ArrowRight
	kbHome   = kb.Home
	kbEscape = kb.Escape
)
