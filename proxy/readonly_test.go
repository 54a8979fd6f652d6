package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// fixedWindows are a client's flow-control windows fixed at 64 KiB (no
// estimation of the bandwidth-delay product, which grows them): a client
// that stops reading stops the proxy's writes soon and predictably.
var fixedWindows = []grpc.DialOption{grpc.WithInitialWindowSize(64 << 10), grpc.WithInitialConnWindowSize(64 << 10)}

// grpcConn is a client connection to p, closed with the test.
func grpcConn(t *testing.T, p *Proxy, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(p.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestReadonlyRefusesEveryWriteOverGRPC calls every write RPC of the etcd
// v3 API through a readonly proxy and expects Unimplemented with a message
// naming readonly; reads still work.
func TestReadonlyRefusesEveryWriteOverGRPC(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{Mode: ReadOnly, Endpoints: c.Endpoints()})
	conn := grpcConn(t, p)
	ctx := ctxT(t)
	kv, lease, clus := pb.NewKVClient(conn), pb.NewLeaseClient(conn), pb.NewClusterClient(conn)
	mt, auth := pb.NewMaintenanceClient(conn), pb.NewAuthClient(conn)
	lock, elec := v3lockpb.NewLockClient(conn), v3electionpb.NewElectionClient(conn)
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k")}}}
	get := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	nestedWrite := &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Failure: []*pb.RequestOp{put}}}}

	writes := map[string]func() error{
		"Put":         func() error { _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("k")}); return err },
		"DeleteRange": func() error { _, err := kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k")}); return err },
		"Txn(put)":    func() error { _, err := kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{get, put}}); return err },
		"Txn(nested)": func() error { _, err := kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{nestedWrite}}); return err },
		"Compact":     func() error { _, err := kv.Compact(ctx, &pb.CompactionRequest{Revision: 1}); return err },
		"LeaseGrant":  func() error { _, err := lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 10}); return err },
		"LeaseRevoke": func() error { _, err := lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: 1}); return err },
		"MemberAdd": func() error {
			_, err := clus.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{"http://127.0.0.1:1"}})
			return err
		},
		"MemberRemove":  func() error { _, err := clus.MemberRemove(ctx, &pb.MemberRemoveRequest{ID: 1}); return err },
		"MemberUpdate":  func() error { _, err := clus.MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: 1}); return err },
		"MemberPromote": func() error { _, err := clus.MemberPromote(ctx, &pb.MemberPromoteRequest{ID: 1}); return err },
		"Defragment":    func() error { _, err := mt.Defragment(ctx, &pb.DefragmentRequest{}); return err },
		"Alarm(deactivate)": func() error {
			_, err := mt.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE, Alarm: pb.AlarmType_NOSPACE})
			return err
		},
		"Alarm(activate)": func() error {
			_, err := mt.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, Alarm: pb.AlarmType_NOSPACE})
			return err
		},
		"MoveLeader":  func() error { _, err := mt.MoveLeader(ctx, &pb.MoveLeaderRequest{TargetID: 1}); return err },
		"Downgrade":   func() error { _, err := mt.Downgrade(ctx, &pb.DowngradeRequest{}); return err },
		"AuthEnable":  func() error { _, err := auth.AuthEnable(ctx, &pb.AuthEnableRequest{}); return err },
		"AuthDisable": func() error { _, err := auth.AuthDisable(ctx, &pb.AuthDisableRequest{}); return err },
		"UserAdd":     func() error { _, err := auth.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "u"}); return err },
		"UserDelete":  func() error { _, err := auth.UserDelete(ctx, &pb.AuthUserDeleteRequest{Name: "u"}); return err },
		"UserChangePassword": func() error {
			_, err := auth.UserChangePassword(ctx, &pb.AuthUserChangePasswordRequest{Name: "u"})
			return err
		},
		"UserGrantRole":  func() error { _, err := auth.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "u"}); return err },
		"UserRevokeRole": func() error { _, err := auth.UserRevokeRole(ctx, &pb.AuthUserRevokeRoleRequest{Name: "u"}); return err },
		"RoleAdd":        func() error { _, err := auth.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: "r"}); return err },
		"RoleDelete":     func() error { _, err := auth.RoleDelete(ctx, &pb.AuthRoleDeleteRequest{Role: "r"}); return err },
		"RoleGrantPermission": func() error {
			_, err := auth.RoleGrantPermission(ctx, &pb.AuthRoleGrantPermissionRequest{Name: "r"})
			return err
		},
		"RoleRevokePermission": func() error {
			_, err := auth.RoleRevokePermission(ctx, &pb.AuthRoleRevokePermissionRequest{Role: "r"})
			return err
		},
		"Lock":   func() error { _, err := lock.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("l")}); return err },
		"Unlock": func() error { _, err := lock.Unlock(ctx, &v3lockpb.UnlockRequest{Key: []byte("l/1")}); return err },
		"Campaign": func() error {
			_, err := elec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: []byte("e"), Value: []byte("v")})
			return err
		},
		"Proclaim": func() error {
			_, err := elec.Proclaim(ctx, &v3electionpb.ProclaimRequest{Value: []byte("v")})
			return err
		},
		"Resign": func() error { _, err := elec.Resign(ctx, &v3electionpb.ResignRequest{}); return err },
		"LeaseKeepAlive": func() error {
			s, err := lease.LeaseKeepAlive(ctx)
			if err != nil {
				return err
			}
			if err := s.Send(&pb.LeaseKeepAliveRequest{ID: 1}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			_, err = s.Recv()
			return err
		},
	}
	for name, call := range writes {
		err := call()
		if status.Code(err) != codes.Unimplemented || !strings.Contains(status.Convert(err).Message(), "readonly") {
			t.Errorf("%s: got %v, want Unimplemented saying readonly", name, err)
		}
	}

	// Reads pass.
	direct := c.Client(t)
	if _, err := direct.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if r, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("k")}); err != nil || len(r.Kvs) != 1 {
		t.Errorf("Range: %v %v", r, err)
	}
	if _, err := kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{get}, Failure: []*pb.RequestOp{get}}); err != nil {
		t.Errorf("read-only Txn: %v", err)
	}
	if _, err := clus.MemberList(ctx, &pb.MemberListRequest{}); err != nil {
		t.Errorf("MemberList: %v", err)
	}
	if _, err := mt.Status(ctx, &pb.StatusRequest{}); err != nil {
		t.Errorf("Status: %v", err)
	}
	if _, err := mt.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_GET}); err != nil {
		t.Errorf("Alarm GET: %v", err)
	}
	cli := proxyClient(t, p)
	wch := cli.Watch(ctx, "k", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created || wr.Err() != nil {
		t.Errorf("watch through readonly proxy: %+v", wr)
	}
	if _, err := direct.Put(ctx, "k", "v2"); err != nil {
		t.Fatal(err)
	}
	if wr := <-wch; len(wr.Events) != 1 {
		t.Errorf("watch event: %+v", wr)
	}
}

// TestReadonlyRefusesEveryWriteOverHTTP does the same over the JSON
// gateway: 501 and a body saying readonly.
func TestReadonlyRefusesEveryWriteOverHTTP(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	p := startProxy(t, Config{Mode: ReadOnly, PeerURLs: c.PeerURLs()})
	base := "http://" + p.Addr().String()
	writes := map[string]string{
		"/v3/kv/put":                          `{"key":"YQ==","value":"Yg=="}`,
		"/v3/kv/deleterange":                  `{"key":"YQ=="}`,
		"/v3/kv/txn":                          `{"success":[{"request_put":{"key":"YQ=="}}]}`,
		"/v3/kv/compaction":                   `{"revision":1}`,
		"/v3/lease/grant":                     `{"TTL":5}`,
		"/v3/lease/revoke":                    `{"ID":1}`,
		"/v3/kv/lease/revoke":                 `{"ID":1}`,
		"/v3/lease/keepalive":                 `{"ID":1}`,
		"/v3/cluster/member/add":              `{"peerURLs":["http://127.0.0.1:1"]}`,
		"/v3/cluster/member/remove":           `{"ID":1}`,
		"/v3/cluster/member/update":           `{"ID":1}`,
		"/v3/cluster/member/promote":          `{"ID":1}`,
		"/v3/maintenance/defragment":          `{}`,
		"/v3/maintenance/alarm":               `{"action":"DEACTIVATE","alarm":"NOSPACE"}`,
		"/v3/auth/enable":                     `{}`,
		"/v3/auth/disable":                    `{}`,
		"/v3/auth/user/add":                   `{"name":"u","password":"p"}`,
		"/v3/auth/user/delete":                `{"name":"u"}`,
		"/v3/auth/user/changepw":              `{"name":"u","password":"p"}`,
		"/v3/auth/user/grant":                 `{"user":"u","role":"r"}`,
		"/v3/auth/user/revoke":                `{"name":"u","role":"r"}`,
		"/v3/auth/role/add":                   `{"name":"r"}`,
		"/v3/auth/role/delete":                `{"role":"r"}`,
		"/v3/auth/role/grant":                 `{"name":"r"}`,
		"/v3/auth/role/revoke":                `{"role":"r"}`,
		"/v3/maintenance/transfer-leadership": `{"targetID":1}`,
		"/v3/maintenance/downgrade":           `{"action":"VALIDATE","version":"3.7"}`,
		"/v3/lock/lock":                       `{"name":"bA=="}`,
		"/v3/lock/unlock":                     `{"key":"bA=="}`,
		"/v3/election/campaign":               `{"name":"ZQ==","value":"dg=="}`,
		"/v3/election/proclaim":               `{"value":"dg=="}`,
		"/v3/election/resign":                 `{}`,
	}
	for path, body := range writes {
		code, resp := post(t, base+path, body)
		if code != http.StatusNotImplemented || !strings.Contains(resp, "readonly") {
			t.Errorf("POST %s: %d %s; want 501 saying readonly", path, code, resp)
		}
	}
	if code, resp := post(t, base+"/v3/kv/range", `{"key":"YQ=="}`); code != http.StatusOK {
		t.Errorf("range: %d %s", code, resp)
	}
	if code, resp := post(t, base+"/v3/kv/txn", `{"success":[{"request_range":{"key":"YQ=="}}]}`); code != http.StatusOK {
		t.Errorf("read-only txn: %d %s", code, resp)
	}
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient(t).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var _ = context.Background

// httpClient returns a client whose connections close when the test ends.
func httpClient(t *testing.T) *http.Client {
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}
