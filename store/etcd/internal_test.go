package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestWrapMapsErrors(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil { // clientv3.New does not dial
		t.Fatal(err)
	}
	defer cli.Close()
	s := newStore(cli, false, resolved{endpoints: []string{"http://127.0.0.1:1"}, requestTimeout: 5 * time.Second})
	live := context.Background()
	cancelled, cancel := context.WithCancel(live)
	cancel()
	expired, cancel2 := context.WithDeadline(live, time.Now().Add(-time.Second))
	defer cancel2()

	// timedOut and closedUnder are call contexts the watchdog ended.
	ended := func(cause error) func(context.Context) context.Context {
		return func(p context.Context) context.Context {
			c, cancel := context.WithCancelCause(p)
			cancel(cause)
			return c
		}
	}
	for _, tc := range []struct {
		name   string
		parent context.Context
		call   func(context.Context) context.Context // the call's context; the parent if nil
		err    error
		is     []error
		isNot  []error
		substr string
	}{
		{"lease not found", live, nil, rpctypes.ErrLeaseNotFound, []error{store.ErrLeaseNotFound}, nil, `store: lease not found (expired or revoked): etcd op "k"`},
		{"lease not found, grpc form", live, nil, rpctypes.Error(rpctypes.ErrGRPCLeaseNotFound), []error{store.ErrLeaseNotFound}, nil, ""},
		{"compacted", live, nil, rpctypes.ErrCompacted, []error{store.ErrCompacted}, nil, ""},
		{"no leader", live, nil, rpctypes.ErrNoLeader, []error{store.ErrUnavailable, rpctypes.ErrNoLeader}, nil, "no leader"},
		{"server timeout", live, nil, rpctypes.ErrTimeout, []error{store.ErrUnavailable}, nil, "127.0.0.1:1"},
		{"transport", live, nil, status.Error(codes.Unavailable, "connection refused"), []error{store.ErrUnavailable}, nil, "connection refused"},
		{"deadline error", live, nil, context.DeadlineExceeded, []error{store.ErrUnavailable, context.DeadlineExceeded}, nil, "within 5s (RequestTimeout)"},
		{"request timeout", live, ended(errRequestTimeout), context.Canceled, []error{store.ErrUnavailable}, []error{context.Canceled}, "no answer from http://127.0.0.1:1 within 5s (RequestTimeout)"},
		{"closed during the call", live, ended(errClosedDuringCall), context.Canceled, []error{store.ErrClosed}, []error{store.ErrUnavailable}, ""},
		{"caller deadline", expired, nil, context.DeadlineExceeded, []error{store.ErrUnavailable, context.DeadlineExceeded}, nil, "before the caller's deadline"},
		{"caller cancel", cancelled, nil, context.Canceled, []error{context.Canceled}, []error{store.ErrUnavailable}, ""},
		{"permission denied", live, nil, rpctypes.ErrPermissionDenied, []error{rpctypes.ErrPermissionDenied}, []error{store.ErrUnavailable}, "lack permission"},
		{"too large", live, nil, rpctypes.ErrRequestTooLarge, []error{rpctypes.ErrRequestTooLarge}, nil, "--max-request-bytes"},
		{"no space", live, nil, rpctypes.ErrNoSpace, []error{rpctypes.ErrNoSpace}, nil, "NOSPACE"},
		{"other", live, nil, errors.New("boom"), nil, []error{store.ErrUnavailable}, `etcd op "k": boom`},
	} {
		if tc.call == nil {
			tc.call = func(p context.Context) context.Context { return p }
		}
		t.Run(tc.name, func(t *testing.T) {
			got := s.wrap(tc.parent, tc.call(tc.parent), `op "k"`, tc.err)
			for _, target := range tc.is {
				if !errors.Is(got, target) {
					t.Errorf("%v does not match %v", got, target)
				}
			}
			for _, target := range tc.isNot {
				if errors.Is(got, target) {
					t.Errorf("%v matches %v", got, target)
				}
			}
			if !strings.Contains(got.Error(), tc.substr) {
				t.Errorf("%q does not contain %q", got, tc.substr)
			}
		})
	}
	if s.wrap(live, live, "x", nil) != nil {
		t.Error("wrap(nil) is not nil")
	}
	_ = s.Close()
	if got := s.wrap(live, live, "x", rpctypes.ErrTimeout); !errors.Is(got, store.ErrClosed) {
		t.Errorf("after Close: %v", got)
	}
}

func TestZapToSlog(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	z := zapLogger(l).Named("etcd-client").With(zap.String("endpoint", "e1"))
	z.Debug("dropped: below the handler's level")
	z.Warn("retrying", zap.Error(fmt.Errorf("boom")), zap.Duration("backoff", time.Second), zap.Strings("eps", []string{"a", "b"}))
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("want exactly one JSON record, got %q: %v", buf.String(), err)
	}
	for k, want := range map[string]any{"level": "WARN", "msg": "retrying", "logger": "etcd-client", "endpoint": "e1", "error": "boom"} {
		if rec[k] != want {
			t.Errorf("%s = %v, want %v (record %v)", k, rec[k], want, rec)
		}
	}
	if rec["backoff"] == nil || rec["eps"] == nil {
		t.Errorf("fields lost: %v", rec)
	}
	if zapLogger(nil).Core().Enabled(zap.ErrorLevel) {
		t.Error("nil logger is not a no-op")
	}
	// The client's warning about each failed attempt of a retried call is
	// debug: `beacon serve --etcd-endpoints` of an unreachable etcd printed
	// it before its one-line error.
	buf.Reset()
	z.Warn("retrying of unary invoker failed", zap.Error(fmt.Errorf("boom")))
	if buf.Len() != 0 {
		t.Errorf("per-attempt warning logged at info level: %s", buf.String())
	}
	var dbg bytes.Buffer
	zapLogger(slog.New(slog.NewTextHandler(&dbg, &slog.HandlerOptions{Level: slog.LevelDebug}))).Warn("retrying of unary invoker failed")
	if !strings.Contains(dbg.String(), "level=DEBUG") {
		t.Errorf("per-attempt warning at debug level: %q", dbg.String())
	}
}

func TestConfigLogValueRedactsPassword(t *testing.T) {
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("cfg", "etcd", Config{Username: "u", Password: "hunter2"})
	if strings.Contains(buf.String(), "hunter2") || !strings.Contains(buf.String(), "REDACTED") {
		t.Fatalf("log line %q", buf.String())
	}
}

func TestWatchdog(t *testing.T) {
	const timeout = 80 * time.Millisecond
	w := &watchdog{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); w.run(timeout, stop) }()

	// A call that returns in time is forgotten and not cancelled.
	c, tc := w.begin(context.Background())
	w.end(tc)
	if !errors.Is(context.Cause(c), context.Canceled) {
		t.Fatalf("ended call: cause %v", context.Cause(c))
	}

	// Calls that run too long are cancelled after timeout..9/8 timeout,
	// the others are left alone whatever their order of ending.
	start := time.Now()
	c1, tc1 := w.begin(context.Background())
	defer w.end(tc1)
	_, tc2 := w.begin(context.Background())
	c3, tc3 := w.begin(context.Background())
	defer w.end(tc3)
	w.end(tc2) // from the middle of the list
	select {
	case <-c3.Done():
	case <-time.After(10 * timeout):
		t.Fatal("overdue call not cancelled")
	}
	took := time.Since(start)
	for _, c := range []context.Context{c1, c3} {
		if !errors.Is(context.Cause(c), errRequestTimeout) || took < timeout {
			t.Fatalf("cancelled after %v (timeout %v), cause %v", took, timeout, context.Cause(c))
		}
	}

	// Close cancels the calls still running, and later calls at once.
	c, tc = w.begin(context.Background())
	defer w.end(tc)
	close(stop)
	<-done
	if !errors.Is(context.Cause(c), errClosedDuringCall) {
		t.Fatalf("call running at close: cause %v", context.Cause(c))
	}
	c, tc = w.begin(context.Background())
	defer w.end(tc)
	if !errors.Is(context.Cause(c), errClosedDuringCall) {
		t.Fatalf("call after close: cause %v", context.Cause(c))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.head != nil || w.tail != nil {
		t.Fatal("calls still tracked after close")
	}
}
