// Package connlimit bounds the connections a listener holds open: in all,
// and from one client address, so that a client holding many connections
// (or reopening them as the server closes them) cannot take every place
// from the others.
//
// One address is not one client: every process of a host shares
// 127.0.0.1, and everyone behind a NAT or a reverse proxy shares its
// address. So a bound reached does not refuse the newcomer: it makes room
// by closing a connection that is doing nothing — the oldest of those
// that never completed a request (silent: opened and left, or trickling a
// request that never ends), else the one idle longest since its last
// request. A connection with a request in flight is never closed for
// another, unless its client has stopped taking the answer (a write to it
// has waited stuckWrite, a second): that place is its to lose, as a silent
// connection's is. Only when every connection of the address has a
// request in flight, its client reading, is a new connection from it
// refused (closed at once); only when every connection of the listener
// has one does a new connection wait (in the kernel's accept queue) until
// one closes. A client that holds idle connections
// therefore sheds its own first, and cannot lock out those who share its
// address and make requests.
//
// What counts as a request in flight: for a server that marks them
// (Handler with ConnContext, as net/http allows), from the moment a
// request has arrived whole — its header, and its body read to its end —
// until its handler returns; a request whose body is still coming (or
// never comes: one byte of a body of a hundred, and then nothing) holds
// its connection no more than a silent one does. For a gRPC server
// (GRPCMarks), each RPC from its start to its end: a connection with a
// stream open (an xDS client's) is in use however long the stream lasts.
// For any other server (DNS over TCP), a connection the server has
// written to has completed a request (such servers write only to answer),
// and none is ever in flight.
package connlimit

import (
	"container/list"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config configures a Listener.
type Config struct {
	// Max bounds the connections open at once (at least 1).
	Max int
	// PerAddr bounds those of one client address (host, without the
	// port); no bound when <= 0.
	PerAddr int
	// Marked says that the server marks each request (Handler and
	// ConnContext, or GRPCMarks); otherwise a write marks a completed
	// request.
	Marked bool
	// Log receives one line a minute at most per kind of event; nil
	// discards. What names the listener in it (e.g. "HTTP").
	Log  *slog.Logger
	What string
}

// DefaultMax is a bound on a listener's connections that leaves the
// process the file descriptors it needs for everything else: a quarter of
// its open-file limit (Go raises the soft limit to the hard one at
// start), at least 256.
func DefaultMax() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	return int(max(256, min(rl.Cur/4, 1<<20)))
}

// Listener returns ln bounded as opts say.
func Listener(ln net.Listener, opts Config) net.Listener {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	l := &listener{Listener: ln, opts: opts, sem: make(chan struct{}, max(opts.Max, 1)), hosts: map[string]*host{}, byAddr: map[string]*conn{}}
	l.all.init()
	return l
}

// queue orders the connections that may make room: silent ones by
// accept time, idle ones by the end of their last request; and holds
// those with a request in flight (busy), which make room only when stuck.
type queue struct{ silent, idle, busy list.List }

func (q *queue) init() {
	q.silent.Init()
	q.idle.Init()
	q.busy.Init()
}

// stuckWrite is how long a write to its client must have waited for a
// connection with a request in flight to make room as an idle one does:
// its client has stopped taking its answers (a process that sends request
// after request and never reads), and the place is its to lose, as a
// silent connection's is. A client that reads keeps each write short (a
// write ends once what it writes fits in the kernel's buffers); one that
// leaves them full for a second counts, at a cap, as one that stopped.
const stuckWrite = time.Second

// victim returns the connection to close to make room, or nil: the
// oldest silent one, else the one idle longest, else the one whose write
// has waited longest, if at least stuckWrite.
func (q *queue) victim(now time.Time) *conn {
	if e := q.silent.Front(); e != nil {
		return e.Value.(*conn)
	}
	if e := q.idle.Front(); e != nil {
		return e.Value.(*conn)
	}
	var stuck *conn
	var since int64
	for e := q.busy.Front(); e != nil; e = e.Next() {
		c := e.Value.(*conn)
		w := c.writingSince.Load()
		if w != 0 && now.UnixNano()-w >= int64(stuckWrite) && (stuck == nil || w < since) {
			stuck, since = c, w
		}
	}
	return stuck
}

// victimLocked returns the connection of q to close to make room, or nil.
func (l *listener) victimLocked(q *queue) *conn {
	return q.victim(time.Now())
}

// host is one client address.
type host struct {
	name string
	n    int // connections open
	q    queue
}

type listener struct {
	net.Listener
	opts Config
	sem  chan struct{} // a place per open connection

	mu     sync.Mutex
	all    queue
	hosts  map[string]*host
	byAddr map[string]*conn // by client address and port (GRPCMarks)
	warned [3]time.Time     // per event kind: when last logged
}

// Event kinds logged.
const (
	evWait = iota
	evShed
	evRefuse
)

// warnLocked reports whether an event of kind k may be logged now (once
// a minute).
func (l *listener) warnLocked(k int) bool {
	if time.Since(l.warned[k]) < time.Minute {
		return false
	}
	l.warned[k] = time.Now()
	return true
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := l.admit(nc); c != nil {
			return c, nil
		}
	}
}

// admit takes places for nc, closing idle connections to make room where
// a bound is reached; nil if nc was refused (and closed).
func (l *listener) admit(nc net.Conn) *conn {
	name := hostOf(nc.RemoteAddr())
	if l.opts.PerAddr > 0 && !l.roomFor(name) {
		_ = nc.Close()
		return nil
	}
	l.takePlace()
	c := &conn{Conn: nc, l: l}
	l.mu.Lock()
	h := l.hosts[name]
	if h == nil {
		h = &host{name: name}
		h.q.init()
		l.hosts[name] = h
	}
	h.n++
	c.host = h
	if ra := nc.RemoteAddr(); ra != nil {
		c.addr = ra.String()
		l.byAddr[c.addr] = c
	}
	l.parkLocked(c)
	l.mu.Unlock()
	return c
}

// roomFor makes room for one more connection from address name if it is
// at its bound, by closing its oldest idle connection; false if every one
// of them has a request in flight.
func (l *listener) roomFor(name string) bool {
	l.mu.Lock()
	h := l.hosts[name]
	if h == nil || h.n < l.opts.PerAddr {
		l.mu.Unlock()
		return true
	}
	shed := l.victimLocked(&h.q)
	if shed == nil {
		warn := l.warnLocked(evRefuse)
		l.mu.Unlock()
		if warn {
			l.opts.Log.Warn("connections from one client address at their cap, each with a request or stream in flight and its client reading: a further one from it is closed at once (clients behind one address: raise the per-client bound)",
				"listener", l.opts.What, "addr", l.Addr().String(), "client", name, "max_per_client", l.opts.PerAddr)
		}
		return false
	}
	warn := l.shedLocked(shed)
	l.mu.Unlock()
	_ = shed.Close()
	if warn {
		l.opts.Log.Warn("connections from one client address at their cap: closed its oldest idle connection (or one whose client stopped reading) to make room for a new one (a client holding connections open, or clients behind one address)",
			"listener", l.opts.What, "addr", l.Addr().String(), "client", name, "max_per_client", l.opts.PerAddr)
	}
	return true
}

// takePlace takes one of the listener's places: at the bound, by closing
// its oldest idle connection, else by waiting until one closes.
func (l *listener) takePlace() {
	select {
	case l.sem <- struct{}{}:
		return
	default:
	}
	l.mu.Lock()
	shed := l.victimLocked(&l.all)
	var warnShed, warnWait bool
	if shed != nil {
		warnShed = l.shedLocked(shed)
	} else {
		warnWait = l.warnLocked(evWait)
	}
	l.mu.Unlock()
	if shed != nil {
		_ = shed.Close()
	}
	switch {
	case warnShed:
		l.opts.Log.Warn("connections at their cap: closed the oldest idle connection to make room for a new one (a flood of connections, or raise the open-file limit)",
			"listener", l.opts.What, "addr", l.Addr().String(), "max", cap(l.sem))
	case warnWait:
		l.opts.Log.Warn("connections at their cap, each with a request or stream in flight and its client reading: new ones wait until one closes (a flood of connections, or raise the open-file limit)",
			"listener", l.opts.What, "addr", l.Addr().String(), "max", cap(l.sem))
	}
	l.sem <- struct{}{}
}

// shedLocked takes c out of the queues, to be closed by the caller
// (outside the lock: closing c takes it); it reports whether to log it
// (once a minute).
func (l *listener) shedLocked(c *conn) bool {
	l.unparkLocked(c)
	l.unbusyLocked(c)
	c.shed = true
	return l.warnLocked(evShed)
}

// parkLocked queues c, now without a request in flight, behind the others
// of its kind.
func (l *listener) parkLocked(c *conn) {
	if c.shed || c.closed {
		return
	}
	c.parkedIdle = c.served.Load()
	if c.parkedIdle {
		c.inAll, c.inHost = l.all.idle.PushBack(c), c.host.q.idle.PushBack(c)
	} else {
		c.inAll, c.inHost = l.all.silent.PushBack(c), c.host.q.silent.PushBack(c)
	}
}

// busyLocked holds c, with a request in flight now, among the busy.
func (l *listener) busyLocked(c *conn) {
	if c.shed || c.closed || c.busyAll != nil {
		return
	}
	c.busyAll, c.busyHost = l.all.busy.PushBack(c), c.host.q.busy.PushBack(c)
}

// unbusyLocked takes c out of the busy (its last request ended, or it
// closes).
func (l *listener) unbusyLocked(c *conn) {
	if c.busyAll == nil {
		return
	}
	l.all.busy.Remove(c.busyAll)
	c.host.q.busy.Remove(c.busyHost)
	c.busyAll, c.busyHost = nil, nil
}

// unparkLocked takes c out of the queues (a request starts, or it closes).
func (l *listener) unparkLocked(c *conn) {
	if c.inAll == nil {
		return
	}
	if c.parkedIdle {
		l.all.idle.Remove(c.inAll)
		c.host.q.idle.Remove(c.inHost)
	} else {
		l.all.silent.Remove(c.inAll)
		c.host.q.silent.Remove(c.inHost)
	}
	c.inAll, c.inHost = nil, nil
}

func hostOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// conn gives its places back once, when closed.
type conn struct {
	net.Conn
	l    *listener
	host *host
	addr string // the client's address and port
	once sync.Once

	served       atomic.Bool  // a request completed (or, unmarked, an answer written)
	busy         atomic.Int32 // requests in flight (marked servers)
	writingSince atomic.Int64 // when the write under way began (Unix ns; 0: none), marked servers

	// Guarded by l.mu.
	inAll, inHost     *list.Element // in the queues (nil: a request in flight, or gone)
	parkedIdle        bool          // queued as idle (else as silent)
	busyAll, busyHost *list.Element // among the busy (a request in flight)
	shed, closed      bool
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		l := c.l
		l.mu.Lock()
		l.unparkLocked(c)
		l.unbusyLocked(c)
		c.closed = true
		if c.host.n--; c.host.n <= 0 {
			delete(l.hosts, c.host.name)
		}
		if l.byAddr[c.addr] == c {
			delete(l.byAddr, c.addr)
		}
		l.mu.Unlock()
		<-l.sem
	})
	return err
}

// Write marks, on a server that does not mark its requests, a completed
// request: the connection is idle from now on, queued behind the others.
// It is marked before the answer is written, so that a client that has
// the answer finds it marked: marked after, a client that read the answer
// and opened a new connection could find it still first in line, and
// shed instead of one idle longer (seen in CI under load).
func (c *conn) Write(b []byte) (int, error) {
	if c.l.opts.Marked {
		// How long this write waits on the client says whether it
		// still reads (see stuckWrite).
		c.writingSince.Store(time.Now().UnixNano())
		defer c.writingSince.Store(0)
	}
	if len(b) > 0 && !c.l.opts.Marked {
		c.l.mu.Lock()
		c.l.unparkLocked(c)
		c.served.Store(true)
		c.l.parkLocked(c)
		c.l.mu.Unlock()
	}
	return c.Conn.Write(b)
}

// begin marks a request in flight on c; end marks it done.
func (c *conn) begin() {
	if c.busy.Add(1) != 1 {
		return
	}
	c.l.mu.Lock()
	c.l.unparkLocked(c)
	c.l.busyLocked(c)
	c.l.mu.Unlock()
}

func (c *conn) end() {
	c.served.Store(true)
	if c.busy.Add(-1) != 0 {
		return
	}
	c.l.mu.Lock()
	if c.busy.Load() == 0 && c.inAll == nil {
		c.l.unbusyLocked(c)
		c.l.parkLocked(c)
	}
	c.l.mu.Unlock()
}

type connKey struct{}

// ConnContext is for http.Server.ConnContext: it keeps the request's
// connection for Handler.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// Handler marks each request h serves as in flight on its connection,
// from the moment it has arrived whole (its body read to its end, at once
// when it has none) until h returns, on a listener with Config.Marked
// (needs ConnContext). Requests on other connections pass through.
func Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := ours(r.Context().Value(connKey{}))
		if c == nil {
			h.ServeHTTP(w, r)
			return
		}
		q := &request{c: c}
		defer q.end()
		if r.Body == nil || r.Body == http.NoBody {
			q.begin()
		} else {
			r.Body = &bodyUntilEnd{ReadCloser: r.Body, q: q}
		}
		h.ServeHTTP(w, r)
	})
}

// A request's states: its body still coming, in flight, its handler
// returned.
const (
	reqArriving int32 = iota
	reqInFlight
	reqDone
)

// request is one request on c, from its header to its handler's return.
type request struct {
	c     *conn
	state atomic.Int32
}

// begin marks the request in flight, once, unless its handler returned.
func (q *request) begin() {
	if q.state.CompareAndSwap(reqArriving, reqInFlight) {
		q.c.begin()
	}
}

// end marks the handler returned. A request that was never in flight was
// answered all the same (refused before its body ended): its connection,
// still queued, goes behind the idle ones as one that completed a request.
func (q *request) end() {
	if q.state.Swap(reqDone) == reqInFlight {
		q.c.end()
		return
	}
	q.c.served.Store(true)
	q.c.l.mu.Lock()
	defer q.c.l.mu.Unlock()
	if q.c.inAll != nil {
		q.c.l.unparkLocked(q.c)
		q.c.l.parkLocked(q.c)
	}
}

// bodyUntilEnd is a request's body that marks the request in flight when
// it has been read to its end.
type bodyUntilEnd struct {
	io.ReadCloser
	q *request
}

func (b *bodyUntilEnd) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.q.begin()
	}
	return n, err
}

// ours finds the listener's conn under v (a TLS connection wraps it, as
// does any connection with a NetConn method).
func ours(v any) *conn {
	for range 4 {
		switch c := v.(type) {
		case *conn:
			return c
		case interface{ NetConn() net.Conn }:
			v = c.NetConn()
		default:
			return nil
		}
	}
	return nil
}
