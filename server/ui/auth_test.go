package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/server"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const rootPassword = "r00t-pw"

// TestSignedInUsersSeeWhatTheyMayRead runs beacon serve with etcd
// authentication: the page's first API request makes the browser ask for
// the etcd user and password (answered here as a person would), the page
// then shows who is signed in, follows only the namespaces that user may
// read, and offers to remove a discovery token only to a user the API lets
// remove it — whose removal the API then carries out.
func TestSignedInUsersSeeWhatTheyMayRead(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "alice", "alice-pw"); return err },
		func() error { _, err := root.RoleAdd(ctx, "team-a-reader"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "team-a-reader", "/services/team-a/", clientv3.GetPrefixRangeEnd("/services/team-a/"), clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error { _, err := root.UserGrantRole(ctx, "alice", "team-a-reader"); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	a := register(t, s.Registry(), beacon.Instance{Namespace: "team-a", Component: "api", Endpoint: "http", Address: "10.10.0.1:80"})
	register(t, s.Registry(), beacon.Instance{Namespace: "team-b", Component: "api", Endpoint: "http", Address: "10.10.0.2:80"})
	req, _ := http.NewRequest(http.MethodPost, base+bootstrap.TokenPath, strings.NewReader(`{"size":3}`))
	req.SetBasicAuth("root", rootPassword)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var tok bootstrap.CreateTokenResponse
	err = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create token: %d %v", resp.StatusCode, err)
	}

	t.Run("alice reads team-a only and may not remove tokens", func(t *testing.T) {
		p := newTab(t, base)
		asked := p.answerAuth("alice", "alice-pw")
		// The 401s that make the browser ask are logged as failed loads.
		p.allowConsole(`401 \(Unauthorized\)|403 \(Forbidden\)`)
		p.navigate("/ui/services")
		select {
		case u := <-asked:
			t.Logf("the browser asked for credentials at %s", u)
		case <-time.After(10 * time.Second):
			t.Fatal("the browser never asked for credentials")
		}
		p.waitFor(`document.querySelector('#who').textContent === 'alice' && document.querySelector('#live').dataset.state === 'live'`, 10*time.Second)
		p.waitFor(fmt.Sprintf(`document.querySelector('.detail .count').textContent === '1 instance' && [...document.querySelectorAll('.grid .grow')].some(r => r.textContent.includes(%s))`, jsString(a.Instance().ID)), 5*time.Second)
		if n := eval[int](p, `document.querySelectorAll('.tree .titem[aria-level="1"]').length`); n != 1 {
			t.Errorf("alice sees %d namespaces, want team-a only", n)
		}
		p.screenshot("auth-alice")
		p.navigate("/ui/bootstrap/" + tok.Token)
		p.waitFor(`document.querySelector('.error-box')`, 10*time.Second)
		if eval[bool](p, `!!document.querySelector('.actions button')`) {
			t.Errorf("alice is offered to remove a token the API forbids her to")
		}
	})

	t.Run("root sees everything and removes a token", func(t *testing.T) {
		p := newTab(t, base)
		p.answerAuth("root", rootPassword)
		p.allowConsole(`401 \(Unauthorized\)`)
		p.navigate("/ui/services")
		p.waitFor(`document.querySelector('#who').textContent === 'root' && document.querySelector('.detail .count').textContent === '2 instances'`, 10*time.Second)
		p.navigate("/ui/bootstrap/" + tok.Token)
		p.waitFor(`document.querySelector('.card .value')?.textContent === '0 of 3' && document.querySelector('.actions button')?.textContent === 'Remove token…'`, 10*time.Second)
		p.click(`.actions button`)
		p.waitFor(`document.querySelector('.confirm')`, 2*time.Second)
		p.screenshot("auth-root-remove-token")
		p.click(`.confirm .btn.danger`)
		p.waitFor(fmt.Sprintf(`location.pathname === '/ui/bootstrap' && document.querySelector('.page-body').textContent.includes(%s)`, jsString("Removed token "+tok.Token)), 10*time.Second)
		gctx, gcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer gcancel()
		if _, err := bootstrap.TokenStatus(gctx, root, tok.Token); err == nil {
			t.Errorf("the token is still there")
		}
	})
}

// answerAuth makes the tab answer the server's HTTP authentication
// challenges (the browser's sign-in prompt) with user and password, as a
// person typing them would; it returns a channel that receives the URL
// of each request that asked.
func (p *page) answerAuth(user, password string) <-chan string {
	p.t.Helper()
	asked := make(chan string, 16)
	authEvents := chromedp.Events(p.ctx, fetch.AuthRequired)
	paused := chromedp.Events(p.ctx, fetch.RequestPaused)
	call := func(f func(ctx context.Context, t *chromedp.Target) error) { _ = chromedp.Do(p.ctx, chromedp.Func(f)) }
	go func() {
		for ev, err := range authEvents {
			if err != nil {
				return
			}
			select {
			case asked <- ev.Request.URL:
			default:
			}
			call(func(ctx context.Context, t *chromedp.Target) error {
				_, err := cdp.Call(ctx, t, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: ev.RequestID,
					AuthChallengeResponse: &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: user, Password: password}})
				return err
			})
		}
	}()
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			call(func(ctx context.Context, t *chromedp.Target) error {
				_, err := cdp.Call(ctx, t, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
				return err
			})
		}
	}()
	yes := true
	err := chromedp.Do(p.ctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &yes})
		return err
	}))
	if err != nil {
		p.t.Fatal(err)
	}
	return asked
}
