// Package dynamotest writes to etcd what the NVIDIA Dynamo runtime's
// workers write there (lib/runtime's KVStoreDiscovery over its etcd store;
// reference/dynamo-discovery.md §1): one lease per worker process, whose ID
// is the worker's instance ID; each endpoint instance created if absent at
// v1/instances/{ns}/{component}/{endpoint}/{id:x} and each model card at
// v1/mdc/.../{id:x}[/{suffix}], bound to that lease, their values the JSON
// of its tagged union. No Dynamo process runs: the tests feed Beacon the
// bytes one would write.
package dynamotest

import (
	"context"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Worker is one Dynamo worker process: a lease and the keys bound to it.
type Worker struct {
	cli   *clientv3.Client
	Lease clientv3.LeaseID
	// ID is the instance ID of everything the worker registers: its
	// lease's ID, as Dynamo's etcd store makes it (connection_id).
	ID uint64
}

// Start grants the worker's lease with ttl. With keepAlive, the lease is
// kept alive until the test ends (as a live worker does); without, it
// expires ttl after Start unless revoked first.
func Start(tb testing.TB, cli *clientv3.Client, ttl time.Duration, keepAlive bool) *Worker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		tb.Fatalf("dynamotest: grant: %v", err)
	}
	w := &Worker{cli: cli, Lease: l.ID, ID: uint64(l.ID)}
	if keepAlive {
		kctx, stop := context.WithCancel(context.Background())
		ch, err := cli.KeepAlive(kctx, l.ID)
		if err != nil {
			stop()
			tb.Fatalf("dynamotest: keep alive: %v", err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range ch { //nolint:revive // drain the answers
			}
		}()
		tb.Cleanup(func() { stop(); <-done })
	}
	return w
}

// Hex is the worker's instance ID as Dynamo's keys have it.
func (w *Worker) Hex() string { return strconv.FormatUint(w.ID, 16) }

// TCP is the transport of Dynamo's TCP request plane at addr (host:port).
func TCP(addr, endpoint string) string { return `{"tcp":"` + addr + "/" + endpoint + `"}` }

// HTTP is the transport of Dynamo's HTTP request plane at addr.
func HTTP(addr, endpoint string) string {
	return `{"http":"http://` + addr + "/v1/rpc/" + endpoint + `"}`
}

// NATS is the transport of Dynamo's NATS request plane.
func NATS(subject string) string { return `{"nats_tcp":"` + subject + `"}` }

// EndpointValue is the value Dynamo writes for an endpoint instance.
func EndpointValue(ns, component, endpoint string, id uint64, transport string) string {
	return `{"type":"Endpoint","namespace":"` + ns + `","component":"` + component + `","endpoint":"` + endpoint +
		`","instance_id":` + strconv.FormatUint(id, 10) + `,"transport":` + transport +
		`,"device_type":null,"request_plane_codec":"msgpack"}`
}

// ModelValue is the value Dynamo writes for a model deployment card.
func ModelValue(ns, component, endpoint string, id uint64, displayName, suffix string) string {
	s := "null"
	if suffix != "" {
		s = strconv.Quote(suffix)
	}
	return `{"type":"Model","namespace":"` + ns + `","component":"` + component + `","endpoint":"` + endpoint +
		`","instance_id":` + strconv.FormatUint(id, 10) + `,"card_json":{"display_name":` + strconv.Quote(displayName) +
		`,"context_length":40960,"kv_cache_block_size":16},"model_suffix":` + s + `}`
}

// Endpoint registers an endpoint instance and returns its key.
func (w *Worker) Endpoint(tb testing.TB, ns, component, endpoint, transport string) string {
	tb.Helper()
	key := "v1/instances/" + ns + "/" + component + "/" + endpoint + "/" + w.Hex()
	w.Create(tb, key, EndpointValue(ns, component, endpoint, w.ID, transport))
	return key
}

// Model registers a model card (suffix "" for the base model's) and
// returns its key.
func (w *Worker) Model(tb testing.TB, ns, component, endpoint, displayName, suffix string) string {
	tb.Helper()
	key := "v1/mdc/" + ns + "/" + component + "/" + endpoint + "/" + w.Hex()
	if suffix != "" {
		key += "/" + suffix
	}
	w.Create(tb, key, ModelValue(ns, component, endpoint, w.ID, displayName, suffix))
	return key
}

// Create writes value at key on the worker's lease if the key is absent,
// in one transaction, as Dynamo's etcd bucket does (kv_create).
func (w *Worker) Create(tb testing.TB, key, value string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", 0)).
		Then(clientv3.OpPut(key, value, clientv3.WithLease(w.Lease))).Commit()
	if err != nil || !resp.Succeeded {
		tb.Fatalf("dynamotest: create %s: %v (created %v)", key, err, err == nil && resp.Succeeded)
	}
}

// Revoke ends the worker's lease: etcd deletes every key bound to it, as
// when a worker shuts down gracefully.
func (w *Worker) Revoke(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.cli.Revoke(ctx, w.Lease); err != nil {
		tb.Fatalf("dynamotest: revoke: %v", err)
	}
}
