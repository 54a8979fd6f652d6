package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/server"
	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/chromedp/chromedp"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// grantUser creates an etcd user with a role of its own holding perms,
// each "read|readwrite prefix".
func grantUser(t *testing.T, root *clientv3.Client, user, password string, perms ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := root.UserAdd(ctx, user, password); err != nil {
		t.Fatal(err)
	}
	role := user + "-role"
	if _, err := root.RoleAdd(ctx, role); err != nil {
		t.Fatal(err)
	}
	for _, p := range perms {
		kind, prefix, _ := strings.Cut(p, " ")
		typ := clientv3.PermissionType(clientv3.PermRead)
		if kind == "readwrite" {
			typ = clientv3.PermissionType(clientv3.PermReadWrite)
		}
		if _, err := root.RoleGrantPermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix), typ); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := root.UserGrantRole(ctx, user, role); err != nil {
		t.Fatal(err)
	}
}

// apiAs calls the HTTP API as an etcd user; header holds name, value
// pairs.
func apiAs(t *testing.T, base, user, password, method, path, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.SetBasicAuth(user, password)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// registerHTTP registers an instance over the HTTP API as root, as a
// client that heartbeats would.
func registerHTTP(t *testing.T, base, ns, addr string) registryapi.RegisterResponse {
	t.Helper()
	code, body := apiAs(t, base, "root", rootPassword, "POST", registryapi.InstancesPath,
		fmt.Sprintf(`{"namespace":%q,"component":"api","endpoint":"http","address":%q,"ttl":"1m"}`, ns, addr))
	var out registryapi.RegisterResponse
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("register over HTTP: %d %s", code, body)
	}
	return out
}

// TestOperatorActionsInTheDashboard runs beacon serve with etcd
// authentication. A user who may only read the namespace sees no Drain or
// Deregister anywhere (nor does anyone on a server without
// authentication); a user who may write it gets both, per row and in the
// instance details. Draining a Go session's instance (with the mouse)
// shows it draining; deregistering an HTTP registration (with the
// keyboard only, through the instance details and the confirmation
// dialog) removes its row, and its owner's next heartbeat gets 404; an
// action the server refuses shows the API's message in the dialog. No
// console errors besides the sign-in prompt's 401s and the refusal.
func TestOperatorActionsInTheDashboard(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.Security.Auth = true
		c.Security.RootPassword = rootPassword
		c.Security.BcryptCost = 4
	})
	base := s.Endpoints().HTTP
	root, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints().ClientURLs, Username: "root", Password: rootPassword, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close() })
	grantUser(t, root, "wendy", "wendy-pw", "readwrite /services/team-a/")
	grantUser(t, root, "rita", "rita-pw", "read /services/team-a/")
	sess := register(t, s.Registry(), beacon.Instance{Namespace: "team-a", Component: "api", Endpoint: "grpc", Address: "10.20.0.1:50051", Transport: "grpc"})
	owned := registerHTTP(t, base, "team-a", "10.20.0.2:8080")
	row := func(id string) string {
		return fmt.Sprintf(`[...document.querySelectorAll('.grid .grow')].find(r => r.textContent.includes(%s))`, jsString(id))
	}
	noActions := `!document.querySelector('[data-action]') && ![...document.querySelectorAll('.grid .ghead .cell')].some(c => c.textContent === 'Actions')`

	t.Run("a reader gets no actions", func(t *testing.T) {
		p := newTab(t, base)
		p.answerAuth("rita", "rita-pw")
		p.allowConsole(`401 \(Unauthorized\)|403 \(Forbidden\)`)
		p.navigate("/ui/services/team-a")
		p.waitFor(`document.querySelector('#who').textContent === 'rita' && document.querySelector('.detail .count').textContent === '2 instances'`, 10*time.Second)
		p.nextFrames(2)
		if !eval[bool](p, noActions) {
			t.Errorf("a user who may only read is offered operator actions")
		}
		eval[any](p, row(sess.Instance().ID)+`.click()`)
		p.waitFor(`!document.querySelector('.inspector').hidden`, 2*time.Second)
		if !eval[bool](p, noActions) {
			t.Errorf("the instance details offer a reader operator actions")
		}
	})

	t.Run("a writer drains and deregisters", func(t *testing.T) {
		p := newTab(t, base)
		p.answerAuth("wendy", "wendy-pw")
		p.allowConsole(`401 \(Unauthorized\)`)
		p.navigate("/ui/services/team-a")
		p.waitFor(`document.querySelector('#who').textContent === 'wendy' && document.querySelector('.detail .count').textContent === '2 instances'`, 10*time.Second)
		p.waitFor(row(sess.Instance().ID)+`?.querySelector('[data-action="drain"]:not([hidden])') && `+row(owned.Instance.ID)+`?.querySelector('[data-action="deregister"]:not([hidden])')`, 5*time.Second)
		p.screenshot("operator-actions")

		// Drain the Go session's instance with the mouse.
		eval[any](p, row(sess.Instance().ID)+`.querySelector('[data-action="drain"]').click()`)
		p.waitFor(`document.querySelector('dialog.op-dialog').open`, 2*time.Second)
		label := eval[string](p, `document.getElementById(document.querySelector('dialog.op-dialog').getAttribute('aria-labelledby')).textContent`)
		if want := "Drain " + sess.Instance().Ref().String() + "?"; label != want {
			t.Errorf("the dialog is labelled %q, want %q", label, want)
		}
		if !eval[bool](p, `document.activeElement.textContent === 'Cancel'`) {
			t.Errorf("the dialog does not focus Cancel first")
		}
		p.screenshot("operator-drain-dialog")
		p.click(`dialog.op-dialog .btn.danger`)
		p.waitFor(`!document.querySelector('dialog.op-dialog').open && `+row(sess.Instance().ID)+`?.querySelector('.badge')?.textContent === 'draining'`, 5*time.Second)
		p.waitFor(fmt.Sprintf(`document.querySelector('.action-status').textContent === %s`, jsString("Drained "+sess.Instance().Ref().String()+".")), time.Second)
		p.waitFor(row(sess.Instance().ID)+`.querySelector('[data-action="drain"]').hidden`, time.Second)

		// Deregister the HTTP registration with the keyboard only: filter
		// to it, Tab into the grid, Enter opens its details, Tab on to
		// Deregister, Enter, Tab to the confirmation, Enter.
		eval[any](p, `(document.querySelector('.table-tools input').focus(), null)`)
		p.keys(owned.Instance.ID)
		p.waitFor(`document.querySelectorAll('.grid .grow').length === 1`, 2*time.Second)
		p.keys("\t")
		p.waitFor(`document.activeElement.getAttribute('role') === 'grid'`, time.Second)
		p.keys(kbDown)
		p.keys("\r")
		p.waitFor(fmt.Sprintf(`!document.querySelector('.inspector').hidden && document.querySelector('.inspector h2').textContent === %s`, jsString(owned.Instance.Ref().String())), 2*time.Second)
		// Past the grid's sort buttons and the details' Drain….
		deregister := fmt.Sprintf(`document.activeElement.getAttribute('aria-label') === %s`, jsString("Deregister "+owned.Instance.Ref().String()))
		for range 20 {
			p.keys("\t")
			if eval[bool](p, deregister) {
				break
			}
		}
		p.waitFor(deregister, time.Second)
		p.keys("\r")
		p.waitFor(`document.querySelector('dialog.op-dialog').open && document.activeElement.textContent === 'Cancel'`, 2*time.Second)
		if text := eval[string](p, `document.querySelector('dialog.op-dialog').textContent`); !strings.Contains(text, "drain it or stop the process") || !strings.Contains(text, "404 on its next heartbeat") {
			t.Errorf("the deregistration dialog does not explain what happens: %q", text)
		}
		p.screenshot("operator-deregister-dialog")
		p.keys("\t")
		p.waitFor(`document.activeElement.textContent === 'Deregister'`, time.Second)
		p.keys("\r")
		p.waitFor(`!document.querySelector('dialog.op-dialog').open && document.querySelectorAll('.grid .grow').length === 0 && document.querySelector('.inspector .badge')?.textContent === 'gone'`, 5*time.Second)
		code, body := apiAs(t, base, "root", rootPassword, "POST", registryapi.InstancesPath+"/"+owned.Instance.Ref().String()+"/heartbeat", "", registryapi.SecretHeader, owned.Secret)
		if code != http.StatusNotFound {
			t.Errorf("the owner's heartbeat after the deregistration: %d %s, want 404", code, body)
		}

		// A refusal: the instance goes (its owner deregisters it) while
		// the dialog is open; the dialog shows the API's answer.
		late := registerHTTP(t, base, "team-a", "10.20.0.3:8080")
		p.allowConsole(`404 \(Not Found\)`)
		typeClear(p, `.table-tools input`)
		p.waitFor(row(late.Instance.ID)+`?.querySelector('[data-action="deregister"]:not([hidden])')`, 5*time.Second)
		eval[any](p, row(late.Instance.ID)+`.querySelector('[data-action="deregister"]').click()`)
		p.waitFor(`document.querySelector('dialog.op-dialog').open`, 2*time.Second)
		if code, body := apiAs(t, base, "root", rootPassword, "DELETE", registryapi.InstancesPath+"/"+late.Instance.Ref().String(), "", registryapi.SecretHeader, late.Secret); code != http.StatusNoContent {
			t.Fatalf("the owner deregisters: %d %s", code, body)
		}
		p.click(`dialog.op-dialog .btn.danger`)
		p.waitFor(`document.querySelector('dialog.op-dialog [role="alert"]')?.textContent.startsWith('The server refused: ') && document.querySelector('dialog.op-dialog [role="alert"]').textContent.includes('not found')`, 5*time.Second)
		p.screenshot("operator-refused")
		p.click(`dialog.op-dialog .btn:not(.danger)`)
		p.waitFor(`!document.querySelector('dialog.op-dialog').open`, time.Second)
	})

	t.Run("no actions without authentication", func(t *testing.T) {
		plain := startServer(t, nil)
		register(t, plain.Registry(), beacon.Instance{Namespace: "demo", Component: "api", Endpoint: "http", Address: "10.21.0.1:80"})
		p := openPage(t, plain.Endpoints().HTTP, "/ui/services")
		p.waitFor(`document.querySelector('.detail .count').textContent === '1 instance' && document.querySelector('#live').dataset.state === 'live'`, 10*time.Second)
		p.nextFrames(2)
		eval[any](p, `document.querySelector('.grid .grow').click()`)
		p.waitFor(`!document.querySelector('.inspector').hidden`, 2*time.Second)
		if !eval[bool](p, noActions) {
			t.Errorf("a server without authentication offers operator actions")
		}
	})
}

// TestOperatorActionsRefuseOtherSites: the browser of an operator signed
// in to the dashboard visits a page of another site, which tries to drain
// an instance through it (a no-cors fetch and a form's POST, both sent
// without a CORS preflight, with the credentials the browser holds for
// the server). The server refuses both; the instance stays serving.
func TestOperatorActionsRefuseOtherSites(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.Security.Auth = true
		c.Security.RootPassword = rootPassword
		c.Security.BcryptCost = 4
	})
	base := s.Endpoints().HTTP
	reg := register(t, s.Registry(), beacon.Instance{Namespace: "team-a", Component: "api", Endpoint: "http", Address: "10.22.0.1:80"})
	drain := base + registryapi.InstancesPath + "/" + reg.Instance().Ref().String() + "/drain"
	// Another site: a blank page on another origin (localhost, not
	// 127.0.0.1).
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, "<!doctype html><title>elsewhere</title><p>elsewhere</p>")
	}))
	t.Cleanup(evil.Close)
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)

	p := newTab(t, base)
	p.answerAuth("root", rootPassword)
	p.allowConsole(`401 \(Unauthorized\)|403 \(Forbidden\)`)
	// The form's answer is a JSON page of the server, for which Chromium
	// asks the server's /favicon.ico (404: the server has none) — when it
	// gets to it before the test ends.
	p.allowConsole(`404 \(Not Found\) .*/favicon\.ico`)
	p.navigate("/ui/services")
	p.waitFor(`document.querySelector('#who').textContent === 'root' && document.querySelector('[data-action="drain"]')`, 10*time.Second)

	if err := chromedp.Do(p.ctx, chromedp.Navigate(evilURL)); err != nil {
		t.Fatal(err)
	}
	eval[any](p, fmt.Sprintf(`fetch(%s, {method: 'POST', mode: 'no-cors', credentials: 'include'}).then(() => null, () => null)`, jsString(drain)))
	code, body := apiAs(t, base, "root", rootPassword, "GET", registryapi.InstancesPath+"/"+reg.Instance().Ref().String(), "")
	if code != http.StatusOK || !strings.Contains(body, `"status":"serving"`) {
		t.Fatalf("after another site's fetch: %d %s", code, body)
	}
	eval[any](p, fmt.Sprintf(`(() => { const f = document.createElement('form'); f.method = 'POST'; f.action = %s; document.body.append(f); f.submit(); return null; })()`, jsString(drain)))
	// The form navigates the tab to the server's answer.
	answered := `location.href === ` + jsString(drain) + ` && document.readyState === 'complete'`
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := p.tryWaitFor(answered, time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the form's answer: %v", err)
		}
	}
	if text := eval[string](p, `document.body.textContent`); !strings.Contains(text, "cross-site request forgery") {
		t.Errorf("the server answered another site's form with %q", text)
	}
	code, body = apiAs(t, base, "root", rootPassword, "GET", registryapi.InstancesPath+"/"+reg.Instance().Ref().String(), "")
	if code != http.StatusOK || !strings.Contains(body, `"status":"serving"`) {
		t.Fatalf("after another site's form: %d %s", code, body)
	}
}
