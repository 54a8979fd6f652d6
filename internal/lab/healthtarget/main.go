// Command healthtarget is a server whose health the drills control: it
// serves the standard gRPC health service (grpc.health.v1, overall
// service "") and GET /healthz on one port each (of 127.0.0.1, or of the
// address -host gives), prints "grpc ADDR" and "http ADDR", then reads
// commands from stdin, one per line, answering each with "ok LINE" once
// done:
//
//	serving       both checks pass (the start)
//	not-serving   gRPC says NOT_SERVING, /healthz answers 503
//	hang          every Check and /healthz request waits until "serving"
//	              (the serving loop deadlocked; Watch streams stay open)
//	flap D        alternate not-serving and serving every D until the
//	              next command
//	flap D N      N changes, one every D, then serving; answered once done
//
// It exits when stdin closes. The health drills (cmd/beacon) build and
// run it; the registrant that keeps its registration alive is another
// process.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// target holds the health both servers answer.
type target struct {
	hs *health.Server

	mu      sync.Mutex
	serving bool
	hung    chan struct{} // closed when a hang ends; nil while not hung
}

func (t *target) set(serving bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.serving = serving
	if t.hung != nil {
		close(t.hung)
		t.hung = nil
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	t.hs.SetServingStatus("", st)
}

func (t *target) hang() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.hung == nil {
		t.hung = make(chan struct{})
	}
}

// wait blocks while hung (or until ctx ends) and returns whether serving.
func (t *target) wait(ctx context.Context) bool {
	t.mu.Lock()
	hung := t.hung
	t.mu.Unlock()
	if hung != nil {
		select {
		case <-hung:
		case <-ctx.Done():
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.serving
}

// hangCheck makes a unary Check wait while the target hangs.
func (t *target) hangCheck(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	t.wait(ctx)
	return h(ctx, req)
}

func (t *target) healthz(w http.ResponseWriter, r *http.Request) {
	if !t.wait(r.Context()) {
		http.Error(w, "not serving", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "healthtarget:", err)
		os.Exit(1)
	}
}

func run() error {
	host := flag.String("host", "127.0.0.1", "IP address to listen on (a free port of it for each server)")
	flag.Parse()
	t := &target{hs: health.NewServer(), serving: true}
	gl, err := net.Listen("tcp", net.JoinHostPort(*host, "0"))
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", net.JoinHostPort(*host, "0"))
	if err != nil {
		return err
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(t.hangCheck))
	healthpb.RegisterHealthServer(gs, t.hs)
	hs := &http.Server{Handler: http.HandlerFunc(t.healthz), ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = gs.Serve(gl) })
	wg.Go(func() { _ = hs.Serve(hl) })
	defer func() {
		t.set(true) // ends any hang, so that the servers can stop
		gs.Stop()
		_ = hs.Close()
		wg.Wait()
	}()
	fmt.Printf("grpc %s\nhttp %s\n", gl.Addr(), hl.Addr())
	return commands(t, os.Stdin)
}

// commands runs the commands read from in until it closes.
func commands(t *target, in *os.File) error {
	stopFlap := func() {}
	defer func() { stopFlap() }()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		stopFlap()
		stopFlap = func() {}
		cmd, arg, _ := strings.Cut(line, " ")
		switch cmd {
		case "serving":
			t.set(true)
		case "not-serving":
			t.set(false)
		case "hang":
			t.hang()
		case "flap":
			var err error
			stopFlap, err = startFlap(t, arg)
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown command %q (serving, not-serving, hang, flap D)", line)
		}
		fmt.Println("ok", line)
	}
	return sc.Err()
}

// startFlap starts "flap D" (until the next command) or runs "flap D N"
// (N changes, then serving) and returns the stop of a flap still going.
func startFlap(t *target, arg string) (stop func(), err error) {
	ds, ns, counted := strings.Cut(arg, " ")
	d, err := time.ParseDuration(ds)
	n, nerr := strconv.Atoi(ns)
	if err != nil || d <= 0 || counted && (nerr != nil || n < 1) {
		return nil, fmt.Errorf("flap %q: want a positive duration such as 500ms, and optionally a count of changes", arg)
	}
	if !counted {
		return flap(t, d), nil
	}
	tick := time.NewTicker(d)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		t.set(i%2 == 1)
	}
	t.set(true)
	return func() {}, nil
}

// flap alternates not-serving and serving every d until the returned stop
// is called; stop returns once the flapping has ended, serving.
func flap(t *target, d time.Duration) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(d)
		defer tick.Stop()
		serving := true
		for {
			select {
			case <-done:
				t.set(true)
				return
			case <-tick.C:
				serving = !serving
				t.set(serving)
			}
		}
	}()
	return func() { close(done); <-ended }
}
