package v2_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"

	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/store/memory"
)

// Serve the v2 discovery protocol under /v2/discovery, create a token, and
// register a member the way etcd's --discovery client does.
func ExampleService() {
	st := memory.New(memory.Config{})
	defer st.Close()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	defer srv.Close()
	svc, err := v2.New(v2.Config{Store: st, BaseURL: srv.URL + "/v2/discovery"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer svc.Close()
	mux.Handle("/v2/discovery/", http.StripPrefix("/v2/discovery", svc))

	resp, err := http.Get(srv.URL + "/v2/discovery/new?size=3")
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	discoveryURL := string(b) // what etcd members get as --discovery
	fmt.Println(strings.HasPrefix(discoveryURL, srv.URL+"/v2/discovery/"))

	form := url.Values{"value": {"infra0=http://10.0.1.10:2380"}}
	req, _ := http.NewRequest("PUT", discoveryURL+"/8e9e05c52164694d?prevExist=false", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	var ev v2.Event
	_ = json.NewDecoder(resp.Body).Decode(&ev)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, ev.Action, *ev.Node.Value)
	// Output:
	// true
	// 201 create infra0=http://10.0.1.10:2380
}
