package dnsapi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/connlimit"
	"github.com/beaconplane/beacon/internal/setting"
	"github.com/beaconplane/beacon/registry"
	"github.com/miekg/dns"
)

// Server answers DNS for the instances of a registry. It follows one
// Watch of everything the registry holds and answers every query from an
// immutable view built from it (never a store read per query); views are
// swapped atomically, so queries never wait for updates.
//
// Create it with New, give it listeners with Serve; Close stops it.
type Server struct {
	cfg Config
	d   registry.Discoverer
	log *slog.Logger
	ans answerer
	m   *metrics

	view    atomic.Pointer[view]
	updated atomic.Pointer[chan struct{}]

	// Owned by the watch loop.
	state map[compID]map[string]beacon.Instance

	mu        sync.Mutex
	servers   []*dns.Server
	closed    bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// view is what queries answer from: a zone, and since when the watch
// behind it has been stale (zero while it is live).
type view struct {
	zone       *zone
	staleSince time.Time
}

// New validates cfg and starts following d. Until the first snapshot is in
// (Ready), names under the domain answer SERVFAIL.
func New(d registry.Discoverer, cfg Config) (*Server, error) {
	if d == nil {
		return nil, errors.New("dnsapi: a registry is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{
		cfg:   cfg,
		d:     d,
		log:   cfg.Logger.With("component", "dns"),
		ans:   answerer{domain: cfg.Domain, ttl: uint32(cfg.TTL / time.Second), udpSize: cfg.UDPSize},
		state: map[compID]map[string]beacon.Instance{},
	}
	ch := make(chan struct{})
	s.updated.Store(&ch)
	m, err := newMetrics(cfg.Metrics, s)
	if err != nil {
		return nil, err
	}
	s.m = m
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.follow(ctx)
	}()
	return s, nil
}

// Domain returns the zone answered, canonical (lower case, trailing dot).
func (s *Server) Domain() string { return s.cfg.Domain }

// Ready reports whether the first snapshot of the registry is in.
func (s *Server) Ready() bool { return s.view.Load() != nil }

// Updated returns a channel closed at the next change of the view (a batch
// applied, or the watch going stale). Take it before checking a condition,
// then wait on it: no change is missed.
func (s *Server) Updated() <-chan struct{} { return *s.updated.Load() }

func (s *Server) swap(v *view) {
	s.view.Store(v)
	ch := make(chan struct{})
	old := s.updated.Swap(&ch)
	close(*old)
}

// current returns the zone to answer from, or nil when there is none that
// may be served: before the first snapshot, or stale for longer than
// MaxStale.
func (s *Server) current() *zone {
	v := s.view.Load()
	if v == nil {
		return nil
	}
	if !v.staleSince.IsZero() && (s.cfg.MaxStale < 0 || time.Since(v.staleSince) > s.cfg.MaxStale) {
		return nil
	}
	return v.zone
}

// follow keeps one watch of everything open and applies its batches
// (registry.Track re-opens it, with backoff, if it ends with an error).
func (s *Server) follow(ctx context.Context) {
	if err := registry.Track(ctx, s.d, beacon.Query{}, s.apply); err != nil {
		s.log.Warn("dns: the registry was closed; no more updates", "err", err)
	}
}

// markStale keeps serving the last view, and starts the MaxStale clock if
// it is not running yet.
func (s *Server) markStale(err error) {
	v := s.view.Load()
	if v == nil || !v.staleSince.IsZero() {
		return
	}
	s.log.Warn("dns: the registry watch lost its store; serving the last view for at most its maximum staleness, then SERVFAIL",
		"err", err, "max_stale", s.cfg.MaxStale, "setting", setting.Namer(s.cfg.SettingName).Name("dnsapi.Config.MaxStale"))
	s.swap(&view{zone: v.zone, staleSince: time.Now()})
}

// apply folds one batch into the state and swaps in a new view.
func (s *Server) apply(b registry.Batch) {
	if b.Kind == registry.Stale {
		s.markStale(b.Err)
		return
	}
	changed := map[compID]bool{}
	if b.Kind == registry.Snapshot {
		for id := range s.state {
			changed[id] = true
		}
		s.state = map[compID]map[string]beacon.Instance{}
	}
	for _, e := range b.Events {
		in := e.Instance
		id := compID{ns: in.Namespace, comp: in.Component}
		changed[id] = true
		key := in.Endpoint + "/" + in.ID
		if e.Type == beacon.Removed {
			if c := s.state[id]; c != nil {
				delete(c, key)
				if len(c) == 0 {
					delete(s.state, id)
				}
			}
			continue
		}
		c := s.state[id]
		if c == nil {
			c = map[string]beacon.Instance{}
			s.state[id] = c
		}
		c[key] = in
	}
	lists := make(map[compID][]beacon.Instance, len(changed))
	for id := range changed {
		list := make([]beacon.Instance, 0, len(s.state[id]))
		for _, in := range s.state[id] {
			list = append(list, in)
		}
		lists[id] = list
	}
	old := s.view.Load()
	base := newZone(s.cfg.Domain, s.ans.ttl)
	if old != nil {
		base = old.zone
		if !old.staleSince.IsZero() {
			s.log.Info("dns: the registry watch is back; answering from the current view", "stale_for", time.Since(old.staleSince).Round(time.Millisecond))
		}
	} else {
		s.log.Info("dns: first registry snapshot in; answering", "domain", s.cfg.Domain)
	}
	nz, left := base.with(b.Revision, lists)
	s.logLeftOut(left)
	s.m.updates.Inc()
	s.swap(&view{zone: nz})
}

// maxLeftOutLogs bounds the instances logged one by one per batch.
const maxLeftOutLogs = 10

// logLeftOut says which serving instances a batch left out of DNS, and
// why (beacon_dns_unanswerable_instances counts them).
func (s *Server) logLeftOut(left []leftOut) {
	for i, l := range left {
		if i == maxLeftOutLogs {
			s.log.Warn("dns: more serving instances left out of DNS", "count", len(left)-i)
			return
		}
		s.log.Warn("dns: serving instance left out of DNS", "instance", l.in.Ref().String(), "address", l.in.Address, "reason", l.why)
	}
}

// bufPool holds UDP answer buffers.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, dns.DefaultMsgSize); return &b }}

// ServeDNS implements dns.Handler.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	_, udp := w.RemoteAddr().(*net.UDPAddr)
	m := s.ans.answer(s.current(), req, udp)
	bp := bufPool.Get().(*[]byte)
	out, err := m.PackBuffer((*bp)[:0])
	if err != nil {
		// Never expected: every record was packable when built. Say so
		// rather than stay silent.
		s.log.Error("dns: cannot pack answer", "err", err, "question", req.Question)
		m = &dns.Msg{MsgHdr: dns.MsgHdr{Id: req.Id, Response: true, Opcode: req.Opcode, Rcode: dns.RcodeServerFailure}, Question: m.Question}
		out, _ = m.PackBuffer((*bp)[:0])
	}
	// Counted before the answer leaves, so that a client that has its
	// answer finds it counted on /metrics.
	var qtype uint16
	if len(req.Question) > 0 {
		qtype = req.Question[0].Qtype
	}
	s.m.count(qtype, m.Rcode, m.Truncated)
	_, _ = w.Write(out)
	if cap(out) <= dns.DefaultMsgSize {
		*bp = out[:0]
		bufPool.Put(bp)
	}
}

// accept is miekg/dns's default header check (responses dropped; not one
// question: FORMERR; opcodes other than QUERY and NOTIFY: NOTIMP), counted.
func (s *Server) accept(h dns.Header) dns.MsgAcceptAction {
	a := dns.DefaultMsgAcceptFunc(h)
	switch a {
	case dns.MsgReject:
		s.m.count(0, dns.RcodeFormatError, false)
	case dns.MsgRejectNotImplemented:
		s.m.count(0, dns.RcodeNotImplemented, false)
	case dns.MsgIgnore:
		s.m.dropped.Inc()
	}
	return a
}

// invalid counts the packets miekg/dns cannot unpack. One shorter than a
// DNS header is dropped without an answer; one with a header (a
// compression loop, a name over 255 bytes) is answered FORMERR by
// miekg/dns after this call, and counted so.
func (s *Server) invalid(m []byte, _ error) {
	if len(m) < headerSize {
		s.m.dropped.Inc()
		return
	}
	s.m.count(0, dns.RcodeFormatError, false)
}

// headerSize is the size of a DNS message header (RFC 1035 4.1.1).
const headerSize = 12

// strictReader hands on a message whose sections do not hold every record
// its header counts as its header alone, which ServeDNS answers FORMERR
// (no question). miekg/dns unpacks such a message without error: it stops
// at the end of the packet, so a question cut off after its type (no
// class) would be answered with class 0, and a query whose header counts
// an additional record that is absent would be answered as if it had none.
// The bytes read are not modified (a DecorateReader must not): a shorter
// slice of them is returned.
type strictReader struct{ dns.Reader }

func (r strictReader) ReadTCP(conn net.Conn, timeout time.Duration) ([]byte, error) {
	m, err := r.Reader.ReadTCP(conn, timeout)
	return checkSections(m), err
}

func (r strictReader) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *dns.SessionUDP, error) {
	m, sess, err := r.Reader.ReadUDP(conn, timeout)
	return checkSections(m), sess, err
}

func (r strictReader) ReadPacketConn(conn net.PacketConn, timeout time.Duration) ([]byte, net.Addr, error) {
	pr, ok := r.Reader.(dns.PacketConnReader)
	if !ok {
		return nil, nil, errors.New("dnsapi: the DNS reader cannot read a net.PacketConn")
	}
	m, addr, err := pr.ReadPacketConn(conn, timeout)
	return checkSections(m), addr, err
}

// checkSections returns m, or its header alone if its sections do not
// hold every question and record its header counts (see strictReader).
func checkSections(m []byte) []byte {
	if len(m) < headerSize || sectionsComplete(m) {
		return m
	}
	return m[:headerSize]
}

// sectionsComplete walks the question and record sections of a message
// (m holds at least a header) and reports whether each one the header
// counts is there in full: a question's name, type and class; a record's
// name, fixed fields and RDATA. Names are only skipped (a compression
// pointer ends one); their content is miekg/dns's to check.
func sectionsComplete(m []byte) bool {
	qd := int(binary.BigEndian.Uint16(m[4:]))
	rrs := int(binary.BigEndian.Uint16(m[6:])) + int(binary.BigEndian.Uint16(m[8:])) + int(binary.BigEndian.Uint16(m[10:]))
	off := headerSize
	for range qd {
		if off = skipName(m, off); off < 0 || off+4 > len(m) {
			return false
		}
		off += 4 // type, class
	}
	for range rrs {
		if off = skipName(m, off); off < 0 || off+10 > len(m) {
			return false
		}
		off += 10 + int(binary.BigEndian.Uint16(m[off+8:])) // type, class, TTL, RDLENGTH, RDATA
		if off > len(m) {
			return false
		}
	}
	return true
}

// skipName returns the offset after the name at off, or -1 if the name
// runs past the end of m or uses a label type other than a plain label or
// a compression pointer (RFC 1035 4.1.4; RFC 6891 retired the others).
func skipName(m []byte, off int) int {
	for off < len(m) {
		c := m[off]
		switch c & 0xC0 {
		case 0x00:
			if c == 0 {
				return off + 1
			}
			off += 1 + int(c)
		case 0xC0:
			if off+2 > len(m) {
				return -1
			}
			return off + 2
		default:
			return -1
		}
	}
	return -1
}

func decorate(r dns.Reader) dns.Reader { return strictReader{r} }

// Listen opens UDP and TCP listeners on the same address (a port of 0
// picks one free for both). A port in use gives an error matching
// syscall.EADDRINUSE.
func Listen(addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dnsapi: DNS address %q: must be host:port, e.g. %s", addr, DefaultAddr)
	}
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, nil, listenErr(addr, err)
		}
		udpAddr := addr
		if port == "0" {
			udpAddr = net.JoinHostPort(host, fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
		}
		pc, err := net.ListenPacket("udp", udpAddr)
		if err != nil {
			_ = ln.Close()
			if port == "0" && errors.Is(err, syscall.EADDRINUSE) && attempt < 10 {
				continue // the TCP port is taken for UDP: pick another
			}
			return nil, nil, listenErr(addr, err)
		}
		return pc, ln, nil
	}
}

func listenErr(addr string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("dnsapi: DNS address %s: address already in use (another DNS server?): %w", addr, err)
	}
	return fmt.Errorf("dnsapi: DNS address %s: %w", addr, err)
}

// Serve answers DNS on pc (UDP) and ln (TCP, at most MaxTCPConns
// connections at once) in the background until Close; either may be nil.
// The server owns and closes them.
func (s *Server) Serve(pc net.PacketConn, ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if pc != nil {
			_ = pc.Close()
		}
		if ln != nil {
			_ = ln.Close()
		}
		return errors.New("dnsapi: server closed")
	}
	if pc != nil {
		srv := &dns.Server{PacketConn: pc, Handler: s, UDPSize: dns.DefaultMsgSize,
			MsgAcceptFunc: s.accept, MsgInvalidFunc: s.invalid, DecorateReader: decorate}
		if err := s.start(srv); err != nil {
			if ln != nil {
				_ = ln.Close()
			}
			return err
		}
	}
	if ln != nil {
		srv := &dns.Server{Listener: connlimit.Listener(ln, connlimit.Config{
			Max: s.cfg.MaxTCPConns, PerAddr: s.cfg.MaxTCPConnsPerClient, Log: s.log, What: "DNS over TCP"}), Handler: s,
			ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
			MsgAcceptFunc: s.accept, MsgInvalidFunc: s.invalid, DecorateReader: decorate}
		return s.start(srv)
	}
	return nil
}

// start runs srv and returns once it serves; s.mu is held.
func (s *Server) start(srv *dns.Server) error {
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	s.servers = append(s.servers, srv)
	errc := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.ActivateAndServe(); err != nil {
			s.log.Error("dns: listener failed", "err", err)
			errc <- err
		}
	}()
	// Wait until it serves, so that Close never races ActivateAndServe.
	select {
	case <-started:
		return nil
	case err := <-errc:
		return fmt.Errorf("dnsapi: serve: %w", err)
	}
}

// Close stops answering and following the registry. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		servers := s.servers
		s.mu.Unlock()
		for _, srv := range servers {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.ShutdownContext(ctx)
			cancel()
		}
		s.cancel()
		s.wg.Wait()
	})
	return nil
}
