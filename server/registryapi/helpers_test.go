package registryapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/memory"
)

func newRegistryForTest(t *testing.T) *registry.StoreRegistry {
	t.Helper()
	st := memory.New(memory.Config{})
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close(); _ = st.Close() })
	return reg
}

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

// doHeaders is do with extra headers (empty values are not sent).
func doHeaders(t *testing.T, method, url, body string, headers map[string]string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		if v != "" {
			req.Header.Set(k, v)
		}
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
	return reply{resp.StatusCode, b, resp.Header}
}

type openStream struct {
	resp   *http.Response
	cancel context.CancelFunc
}

func (s *openStream) close() { s.cancel(); s.resp.Body.Close() }

// openWatchAs opens a watch stream as client, closed when the test ends.
func openWatchAs(t *testing.T, url, client string) *openStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("X-Test-Client", client)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		resp.Body.Close()
		t.Fatalf("watch as %s: %d", client, resp.StatusCode)
	}
	s := &openStream{resp: resp, cancel: cancel}
	t.Cleanup(s.close)
	return s
}

// getAs makes a GET as client and closes the answer at once (a stream
// included).
func getAs(t *testing.T, url, client string) *http.Response {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("X-Test-Client", client)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// waitABit is one poll interval of a loop that waits, with a deadline, for
// the server to notice that a client went away.
func waitABit(t *testing.T) {
	t.Helper()
	tick := time.NewTimer(20 * time.Millisecond)
	defer tick.Stop()
	<-tick.C
}
