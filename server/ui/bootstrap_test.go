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
