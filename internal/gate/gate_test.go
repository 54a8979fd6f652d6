package gate

import (
	"context"
	"errors"
	"testing"
)

func TestGate(t *testing.T) {
	var g Gate
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait on an open gate: %v", err)
	}
	g.Hold()
	g.Hold() // held once
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a held gate with a done context: %v", err)
	}
	done := make(chan error)
	go func() { done <- g.Wait(context.Background()) }()
	g.Release()
	if err := <-done; err != nil {
		t.Fatalf("Wait released: %v", err)
	}
	g.Release() // open: nothing to do
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait after Release: %v", err)
	}
}
