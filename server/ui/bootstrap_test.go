package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/bootstrap"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBootstrapPageWatchesAClusterForm creates a discovery token and lets
// three members join it with the real discovery client, one after the
// other, while the page shows the token filling up.
func TestBootstrapPageWatchesAClusterForm(t *testing.T) {
	s := startServer(t, nil)
	base := s.Endpoints().HTTP
	resp, err := http.Post(base+bootstrap.TokenPath, "application/json", strings.NewReader(`{"size":3}`))
	if err != nil {
		t.Fatal(err)
	}
	var created bootstrap.CreateTokenResponse
	err = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create token: %d %v", resp.StatusCode, err)
	}

	p := openPage(t, base, "/ui/bootstrap")
	// Where the server lists tokens (GET /v1/tokens), the page lists them.
	p.waitFor(`document.querySelector('form.inline input')`, 5*time.Second)
	listed := fmt.Sprintf(`[...document.querySelectorAll('table.data tbody tr')].some(r => r.textContent.includes(%s) && r.textContent.includes('waiting'))`, jsString(created.Token))
	if eval[bool](p, `fetch('/v1/cluster').then(r => r.json()).then(s => s.features.token_list)`) {
		p.waitFor(listed, 5*time.Second)
		p.screenshot("bootstrap-list")
	}
	p.typeText(`form.inline input`, created.Token)
	p.click(`form.inline button[type="submit"]`)
	p.waitFor(fmt.Sprintf(`location.pathname === '/ui/bootstrap/' + %s && document.querySelector('.card .value')?.textContent === '0 of 3'`, jsString(created.Token)), 5*time.Second)

	// Without etcd authentication the API lets everyone remove a token
	// (whoami says so): the page offers it.
	p.waitFor(`document.querySelector('.actions button')?.textContent === 'Remove token…'`, 5*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	joined := make(chan error, 3)
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("node-%d", i)
		go func() {
			_, err := bootstrap.Join(ctx, bootstrap.Config{Token: created.Token, Endpoints: s.Endpoints().ClientURLs}, name,
				[]string{fmt.Sprintf("http://10.8.0.%d:2380", i)})
			joined <- err
		}()
		// The page follows each registration (it re-reads the token every 2 s).
		p.waitFor(fmt.Sprintf(`document.querySelector('.card .value')?.textContent === '%d of 3' && [...document.querySelectorAll('table.data tbody tr')].some(r => r.textContent.includes(%s))`, i, jsString(name)), 10*time.Second)
		if i == 2 {
			p.screenshot("bootstrap-forming")
		}
	}
	for range 3 {
		if err := <-joined; err != nil {
			t.Fatalf("join: %v", err)
		}
	}
	p.waitFor(`document.querySelector('.badge.full') && document.querySelector('[role="progressbar"]').getAttribute('aria-valuenow') === '3' && document.querySelector('pre').textContent.includes('node-1=http://10.8.0.1:2380')`, 5*time.Second)
	p.screenshot("bootstrap-full")

	// An unknown token says so.
	p.navigate("/ui/bootstrap/no-such-token")
	p.waitFor(`document.querySelector('.error-box')?.textContent.includes('There is no token')`, 5*time.Second)
	p.allowConsole(`404 \(Not Found\)`)
}

// TestBootstrapListNamesAClash: a full token whose two members share a
// name cannot form a cluster; the list showed it as plain "full" while
// beacon token status named the clash. Now the list says "full: cannot
// form" with the clash, and the token's page says it too.
func TestBootstrapListNamesAClash(t *testing.T) {
	s := startServer(t, nil)
	base := s.Endpoints().HTTP
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints().ClientURLs, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const token = "clash-token"
	if _, err := bootstrap.CreateToken(ctx, cli, token, 2); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{"http://10.9.0.1:2380", "http://10.9.0.2:2380"} {
		id, err := bootstrap.MemberID([]string{url}, token)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, bootstrap.MemberKey(token, id), "infra="+url); err != nil {
			t.Fatal(err)
		}
	}
	p := openPage(t, base, "/ui/bootstrap")
	if !eval[bool](p, `fetch('/v1/cluster').then(r => r.json()).then(s => s.features.token_list)`) {
		t.Fatal("this server lists tokens: the page must too")
	}
	p.waitFor(fmt.Sprintf(`[...document.querySelectorAll('table.data tbody tr')].some(r => r.textContent.includes(%s) &&
		r.querySelector('.badge.bad')?.textContent === 'full: cannot form' && r.textContent.includes('"infra" is registered by'))`, jsString(token)), 10*time.Second)
	p.screenshot("bootstrap-list-clash")
	p.navigate("/ui/bootstrap/" + token)
	p.waitFor(`document.querySelector('.error-box')?.textContent.includes('"infra" is registered by')`, 10*time.Second)
	p.allowConsole(`409 \(Conflict\)`)
}
