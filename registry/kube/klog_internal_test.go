package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/beaconplane/beacon/internal/syncbuf"
)

// What client-go logs through a context of the registry goes to the
// registry's logger, but for errors that are cancellations (a request the
// registry cut short): those are not news.
func TestKlogContextDropsCancellations(t *testing.T) {
	var buf bytes.Buffer
	ctx := withKlog(context.Background(), slog.New(slog.NewTextHandler(&buf, nil)))
	logger := klog.FromContext(ctx).WithValues("resource", "instancesets")
	logger.Error(fmt.Errorf("reading body: %w", context.Canceled), "Unexpected error when reading response body")
	logger.Error(errors.New("connection refused"), "Failed to watch")
	logger.Info("Caches populated")
	out := buf.String()
	if strings.Contains(out, "Unexpected error") {
		t.Errorf("a cancellation was logged:\n%s", out)
	}
	for _, want := range []string{"Failed to watch", "connection refused", "Caches populated", "resource=instancesets"} {
		if !strings.Contains(out, want) {
			t.Errorf("%q missing from:\n%s", want, out)
		}
	}
}

// SetClientLogger sends klog's global output (client-go without a context
// logger) to the program's logger, cancellations dropped.
func TestSetClientLogger(t *testing.T) {
	var buf syncbuf.Buffer
	SetClientLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(klog.ClearLogger)
	klog.ErrorS(fmt.Errorf("reading body: %w", context.Canceled), "Unexpected error when reading response body")
	klog.ErrorS(errors.New("connection refused"), "Failed to watch")
	klog.Flush()
	out := buf.String()
	if strings.Contains(out, "Unexpected error") || !strings.Contains(out, "Failed to watch") || !strings.Contains(out, "level=ERROR") {
		t.Errorf("klog's global output:\n%s", out)
	}
}
