package kube

import (
	"context"
	"errors"
	"log/slog"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// withKlog returns ctx carrying log as client-go's logger (klog's
// contextual logging): what client-go reports about the requests made
// with ctx, or a context derived from it, goes to the registry's logger
// instead of klog's global one, which writes a format of its own to
// stderr. Errors that are cancellations are dropped: this package cancels
// a request only when it no longer wants the answer (a registry or writer
// closing, a reflector restarted), and client-go logs "Unexpected error
// when reading response body" (context canceled) for each; `beacon serve`
// printed three such lines above its own one-line error when it refused a
// flag after opening the backend.
func withKlog(ctx context.Context, log *slog.Logger) context.Context {
	return klog.NewContext(ctx, logr.FromSlogHandler(dropCancelled{log.Handler()}))
}

// dropCancelled drops the records that carry an error that is a
// cancellation.
type dropCancelled struct{ slog.Handler }

func (h dropCancelled) Handle(ctx context.Context, r slog.Record) error {
	if cancelled(r) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h dropCancelled) WithAttrs(as []slog.Attr) slog.Handler {
	return dropCancelled{h.Handler.WithAttrs(as)}
}

func (h dropCancelled) WithGroup(name string) slog.Handler {
	return dropCancelled{h.Handler.WithGroup(name)}
}

// cancelled reports whether r carries an error that is a cancellation.
func cancelled(r slog.Record) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, context.Canceled) {
			found = true
			return false
		}
		return true
	})
	return found
}

// SetClientLogger sends what client-go logs without a logger of its
// context (klog's global logger, which otherwise writes a format of its
// own to stderr) to log, cancellations dropped as for the registry's own
// requests. It sets process-wide state: for programs, not libraries
// (beacon's commands call it with their logger).
func SetClientLogger(log *slog.Logger) {
	klog.SetSlogLogger(slog.New(dropCancelled{log.Handler()}))
}
