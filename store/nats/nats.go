package nats

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/minver"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/internal/mvcc"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Errors of this package.
var (
	// ErrServerTooOld reports a server without the JetStream features the
	// store needs (per-message TTLs, atomic batch publish).
	ErrServerTooOld = errors.New("nats: server too old")
	// ErrIncompatibleBucket reports an existing bucket whose settings the
	// store cannot work with; the message says what to change.
	ErrIncompatibleBucket = errors.New("nats: incompatible bucket")
	// ErrIncompatibleServer reports a server configured so that the store
	// cannot keep the contract (a max_payload below the value limit).
	ErrIncompatibleServer = errors.New("nats: incompatible server")
	// ErrNoBucket reports a bucket missing from the server for a store
	// that does not create it (Config.MustExist): at Open, or later, when
	// the bucket went away (then it matches store.ErrUnavailable too).
	ErrNoBucket = errors.New("nats: no such bucket")
)

// minPayload is the smallest message the server and the bucket must
// accept: the largest value (store.MaxValueSize) plus room for the
// headers of a write.
const minPayload = store.MaxValueSize + 16<<10

// MinServerVersion is the oldest nats-server the store works with:
// per-message TTLs and subject delete markers arrived in 2.11, atomic batch
// publish in 2.12.
const MinServerVersion = "2.12.0"

// Message headers. The Nats-* ones are the server's.
const (
	hdrPrev      = "Beacon-Prev"   // sequence of the key's previous message
	hdrCreate    = "Beacon-Create" // create revision when the write updates a key
	hdrLease     = "Beacon-Lease"  // lease ID (hex) the key is bound to
	hdrReap      = "Beacon-Reap"   // a deletion of a key whose lease had ended
	hdrBatchSize = "Beacon-Batch"  // messages in the atomic batch this one is part of
	hdrKVOp      = "KV-Operation"
	hdrMarker    = "Nats-Marker-Reason"
	hdrTTL       = "Nats-TTL"
	hdrRollup    = "Nats-Rollup"
	hdrExpSubj   = "Nats-Expected-Last-Subject-Sequence"
	hdrBatchID   = "Nats-Batch-Id"
	hdrBatchSeq  = "Nats-Batch-Sequence"
	hdrBatchDone = "Nats-Batch-Commit"
	metaFormat   = "beacon.format"
	formatV1     = "1"
)

// Store is a store.Store on a NATS JetStream KV bucket. Create it with
// Open; Close it to close its connection.
type Store struct {
	cfg       Config
	logger    *slog.Logger
	nc        *nats.Conn
	js        jetstream.JetStream
	stream    string // KV_<bucket>
	pre       string // "$KV.<bucket>."
	api       string // the JetStream API subject prefix ($JS.API, or of the domain)
	directPre string // the direct get API subject of the stream
	markerTTL time.Duration

	recreate sync.Mutex // one look at a bucket that seems gone at a time

	mu        sync.Mutex
	closed    bool
	done      chan struct{}
	bg        context.Context // ends on Close; for background clean-up
	bgCancel  context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var (
	_ store.Store      = (*Store)(nil)
	_ store.Compactor  = (*Store)(nil)
	_ store.Transactor = (*Store)(nil)
)

func (s *Store) keySubject(key string) string { return s.pre + "k." + encodeKey(key) }
func (s *Store) leaseSubject(id store.LeaseID) string {
	return s.pre + "l." + fmt.Sprintf("%016x", uint64(id))
}
func (s *Store) metaSubject() string    { return s.pre + "m" }
func (s *Store) compactSubject() string { return s.pre + "c" }

// Open connects to the servers, checks their version and the bucket (which
// it creates if missing, unless cfg.MustExist), and returns the store. An unreachable server
// gives an error matching store.ErrUnavailable after cfg.DialTimeout.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Store{
		cfg:    cfg,
		logger: cfg.Logger.With("store", "nats", "bucket", cfg.Bucket),
		stream: "KV_" + cfg.Bucket,
		pre:    "$KV." + cfg.Bucket + ".",
		done:   make(chan struct{}),
	}
	s.bg, s.bgCancel = context.WithCancel(context.Background())
	api := "$JS.API"
	if cfg.Domain != "" {
		api = "$JS." + cfg.Domain + ".API"
	}
	s.api = api
	s.directPre = api + ".DIRECT.GET." + s.stream
	opts := []nats.Option{
		nats.Name(cmp.Or(cfg.Name, "beacon")),
		nats.Timeout(cfg.DialTimeout),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				// The store's own Close: nothing went wrong (every
				// `beacon ls --backend nats` warned of it before its
				// answer; TestNATSReadersNeedABucket).
				return
			}
			s.logger.Warn("disconnected from NATS", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			s.logger.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
	}
	switch {
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if cfg.CertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: nats: cannot connect to %s within %v: %v (is the server running, and are NATS_URL and the credentials right?)",
			store.ErrUnavailable, cfg.URL, cfg.DialTimeout, err)
	}
	s.nc = nc
	if err := s.setup(ctx); err != nil {
		s.bgCancel()
		nc.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) setup(ctx context.Context) error {
	if v := s.nc.ConnectedServerVersion(); !minver.AtLeast(v, MinServerVersion) {
		return fmt.Errorf("%w: nats-server %s lacks per-message TTLs (2.11) and atomic batch publish (2.12), which Beacon's leases need; upgrade the server to %s or later",
			ErrServerTooOld, v, MinServerVersion)
	}
	if mp := s.nc.MaxPayload(); mp < minPayload {
		return fmt.Errorf("%w: the server's max_payload is %d bytes; Beacon stores values of up to %d bytes (store.MaxValueSize) plus headers, so it needs at least %d: set max_payload: 1MB (the NATS default) in the server configuration",
			ErrIncompatibleServer, mp, store.MaxValueSize, minPayload)
	}
	var err error
	if s.cfg.Domain != "" {
		s.js, err = jetstream.NewWithDomain(s.nc, s.cfg.Domain)
	} else {
		s.js, err = jetstream.New(s.nc)
	}
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	if _, err := s.js.AccountInfo(rctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return fmt.Errorf("nats: JetStream is not enabled on the server (or for this account): start nats-server with -js")
		}
		return s.unavailable("reach JetStream", err)
	}
	st, _, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	s.markerTTL = st.CachedInfo().Config.SubjectDeleteMarkerTTL
	return nil
}

// bucket looks up the bucket's stream, checks it, and initialises it.
// Unless the store only reads (Config.MustExist), a missing bucket is
// created with streamConfig; created says whether this call created it.
// Open and a writer that finds its bucket gone both use it, so that a
// bucket created again has the settings of one Open creates.
func (s *Store) bucket(ctx context.Context) (st jetstream.Stream, created bool, err error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	st, err = s.js.Stream(rctx, s.stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && s.cfg.MustExist:
		return nil, false, s.noBucket()
	case errors.Is(err, jetstream.ErrStreamNotFound):
		st, err = s.js.CreateStream(rctx, s.streamConfig())
		created = err == nil
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // created concurrently by another process
			st, err = s.js.Stream(rctx, s.stream)
		}
		if err != nil {
			return nil, false, fmt.Errorf("nats: cannot create bucket %q: %w", s.cfg.Bucket, err)
		}
	case err != nil:
		return nil, false, s.unavailable("look up the bucket", err)
	}
	if err := s.checkBucket(st.CachedInfo().Config); err != nil {
		return nil, false, err
	}
	// The meta subject is never empty: every multi-subject read includes
	// it, so that the read always reports the revision it was as of.
	m := nats.NewMsg(s.metaSubject())
	m.Data = []byte(`{"format":"beacon","version":1}`)
	m.Header.Set(hdrExpSubj, "0")
	if _, err := s.js.PublishMsg(rctx, m); err != nil && !isConflict(err) {
		return nil, false, s.unavailable("initialise the bucket", err)
	}
	return st, created, nil
}

// noBucket is the error of a missing bucket the store does not create.
func (s *Store) noBucket() error {
	return fmt.Errorf("%w: %s: the NATS server has no stream %s; check the name: a bucket is created by the first program that writes to it (beacon register, beacon serve)",
		ErrNoBucket, s.cfg.setting("Bucket", "bucket", s.cfg.Bucket), s.stream)
}

// fail is unavailable for a request to the bucket, except when nothing
// answered it, or a watch's consumer vanished, while the connection is up:
// then the bucket may be gone (see lostBucket).
func (s *Store) fail(ctx context.Context, what string, err error) error {
	if !noResponse(err) || !s.nc.IsConnected() || s.isClosed() {
		return s.unavailable(what, err)
	}
	return s.lostBucket(ctx, what, err)
}

// noResponse reports a request to the bucket that no stream answered, or
// a consumer that went with its stream (deleted, or silent).
func noResponse(err error) bool {
	for _, e := range []error{nats.ErrNoResponders, jetstream.ErrNoStreamResponse, jetstream.ErrStreamNotFound,
		jetstream.ErrConsumerDeleted, jetstream.ErrConsumerNotFound, jetstream.ErrNoHeartbeat} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// lostBucket looks up the bucket after a request nothing answered. When
// its stream is gone (the server restarted without its JetStream data, or
// someone deleted it), a writer creates it again, as Open does, so that
// the owners of registrations, whose leases went with it, write them
// again, and watches, which end, list again; a reader (Config.MustExist)
// reports the missing bucket by name. Either way the request fails with
// store.ErrUnavailable, to be retried.
func (s *Store) lostBucket(ctx context.Context, what string, cause error) error {
	s.recreate.Lock()
	defer s.recreate.Unlock()
	rctx, cancel := s.reqCtx(ctx)
	_, err := s.js.Stream(rctx, s.stream)
	cancel()
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return s.unavailable(what, cause) // there (again), or the server does not say
	}
	if s.cfg.MustExist {
		return fmt.Errorf("%w: nats: cannot %s: %w: bucket %q is gone from the NATS server (restarted without its JetStream data?); the next program that writes to it creates it again",
			store.ErrUnavailable, what, ErrNoBucket, s.cfg.Bucket)
	}
	_, created, err := s.bucket(ctx)
	if err != nil {
		return fmt.Errorf("%w: nats: cannot %s: bucket %q is gone from the NATS server and cannot be created again: %w",
			store.ErrUnavailable, what, s.cfg.Bucket, err)
	}
	if created {
		s.logger.Warn("the bucket is gone from the NATS server (restarted without its JetStream data?): created it again; registrations will be written again by their owners",
			"stream", s.stream)
	}
	return fmt.Errorf("%w: nats: cannot %s: bucket %q was gone from the NATS server (created again, empty)", store.ErrUnavailable, what, s.cfg.Bucket)
}

func (s *Store) streamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                   s.stream,
		Description:            "Beacon discovery store",
		Subjects:               []string{s.pre + ">"},
		MaxMsgsPerSubject:      int64(s.cfg.History),
		MaxMsgs:                -1,
		MaxBytes:               -1,
		MaxMsgSize:             -1,
		MaxConsumers:           -1,
		Storage:                jetstream.FileStorage,
		Replicas:               s.cfg.Replicas,
		Discard:                jetstream.DiscardNew,
		Duplicates:             2 * time.Minute,
		AllowRollup:            true,
		DenyDelete:             true,
		AllowDirect:            true,
		AllowMsgTTL:            true,
		SubjectDeleteMarkerTTL: s.cfg.MarkerTTL,
		AllowAtomicPublish:     true,
		Metadata:               map[string]string{metaFormat: formatV1},
	}
}

// checkBucket refuses an existing bucket the store cannot work with.
func (s *Store) checkBucket(c jetstream.StreamConfig) error {
	name := s.cfg.Bucket
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q (stream %s): %s", ErrIncompatibleBucket, name, s.stream, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Metadata[metaFormat] == "":
		return bad("it was not created by Beacon (no %s metadata); choose another bucket (BEACON_NATS_BUCKET) or delete it", metaFormat)
	case c.Metadata[metaFormat] != formatV1:
		return bad("its Beacon format %q is not supported by this version (it reads %q)", c.Metadata[metaFormat], formatV1)
	case !c.AllowMsgTTL || c.SubjectDeleteMarkerTTL < time.Second:
		return bad("per-message TTLs or subject delete markers are off; leases need both: `nats stream edit %s --allow-msg-ttl --subject-del-markers-ttl 1s`", s.stream)
	case !c.AllowAtomicPublish:
		return bad("atomic batch publish is off; leases need it: `nats stream edit %s --allow-batch`", s.stream)
	case c.MaxMsgsPerSubject < MinHistory:
		return bad("it keeps %d revisions per key; Beacon needs at least %d: `nats stream edit %s --max-msgs-per-subject 64`", c.MaxMsgsPerSubject, MinHistory, s.stream)
	case c.MaxAge != 0:
		return bad("it expires every key after %v (bucket TTL); Beacon keys without a lease must not expire: set the stream's max age to 0", c.MaxAge)
	case !c.AllowDirect || !c.AllowRollup || c.DenyPurge:
		return bad("direct get and rollups must be allowed (allow_direct, allow_rollup_hdrs) and purge not denied")
	case c.MaxMsgSize > 0 && c.MaxMsgSize < minPayload:
		return bad("it refuses messages over %d bytes; Beacon stores values of up to %d bytes plus headers: `nats stream edit %s --max-msg-size -1`", c.MaxMsgSize, store.MaxValueSize, s.stream)
	case c.Mirror != nil || len(c.Sources) > 0:
		return bad("mirrors and sourced buckets are not supported")
	}
	return nil
}

// unavailable wraps a failure to reach the server (including no answer
// within the request timeout) in store.ErrUnavailable. A request that Close
// ended is store.ErrClosed; cancellation by the caller is returned as is.
func (s *Store) unavailable(what string, err error) error {
	if s.isClosed() && (errors.Is(err, context.Canceled) || errors.Is(err, nats.ErrConnectionClosed)) {
		return store.ErrClosed
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w: nats: cannot %s: %w", store.ErrUnavailable, what, err)
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Store) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return store.ErrClosed
	}
	return nil
}

// Close ends every watch and every request in flight (they fail with
// store.ErrClosed), waits for the store's goroutines and closes the
// connection. Every wait of the store ends when Close cancels it, so Close
// returns promptly whatever the server does. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.done)
		s.mu.Unlock()
		s.bgCancel()
	})
	s.wg.Wait()
	s.nc.Close()
	return nil
}

// isConflict reports a failed expected-sequence check.
func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// isEnd reports a message that deletes its subject: a KV delete or purge,
// or a server marker (TTL expiry, purge).
func isEnd(h nats.Header) bool {
	if h == nil {
		return false
	}
	op := h.Get(hdrKVOp)
	return op == "DEL" || op == "PURGE" || h.Get(hdrMarker) != ""
}

// decodeKV builds the KeyValue of a put message of key.
func decodeKV(key string, m *rawMsg) store.KeyValue {
	rev := logicalRev(m)
	kv := store.KeyValue{Key: key, Value: m.data, CreateRevision: rev, ModRevision: rev}
	if kv.Value == nil {
		kv.Value = []byte{}
	}
	if c, err := strconv.ParseInt(m.header.Get(hdrCreate), 10, 64); err == nil && c > 0 {
		kv.CreateRevision = c
	}
	kv.Lease = parseLeaseID(m.header.Get(hdrLease))
	return kv
}

// batchPos returns the position (1-based) and size of the atomic batch m
// was written in, or 0, 0.
func batchPos(m *rawMsg) (int, int) {
	n, err1 := strconv.Atoi(m.header.Get(hdrBatchSize))
	i, err2 := strconv.Atoi(m.header.Get(hdrBatchSeq))
	if err1 != nil || err2 != nil || i < 1 || i > n {
		return 0, 0
	}
	return i, n
}

// logicalRev is the revision of a message: its sequence, or for a message
// of an atomic batch (a transaction) the sequence of the batch's last
// message, so that every write of a transaction has one revision.
func logicalRev(m *rawMsg) int64 {
	i, n := batchPos(m)
	return int64(m.seq) + int64(n-i)
}

func parseLeaseID(s string) store.LeaseID {
	if s == "" {
		return store.NoLease
	}
	n, err := strconv.ParseUint(s, 16, 63)
	if err != nil {
		return store.NoLease
	}
	return store.LeaseID(n)
}

// leaseState is a lease as its subject's last message shows it.
type leaseState struct {
	live   bool
	seq    uint64 // its last message
	endSeq uint64 // the message that ended it, if ended
	ttl    time.Duration
	data   []byte
}

type leaseRecord struct {
	TTLMillis int64 `json:"ttl_ms"`
}

func leaseFrom(m *rawMsg) leaseState {
	if m == nil {
		return leaseState{}
	}
	if isEnd(m.header) {
		return leaseState{seq: m.seq, endSeq: m.seq}
	}
	var rec leaseRecord
	if err := json.Unmarshal(m.data, &rec); err != nil || rec.TTLMillis <= 0 {
		return leaseState{seq: m.seq, endSeq: m.seq} // not a lease record: treat as ended
	}
	return leaseState{live: true, seq: m.seq, ttl: time.Duration(rec.TTLMillis) * time.Millisecond, data: m.data}
}

func (s *Store) lease(ctx context.Context, id store.LeaseID) (leaseState, error) {
	m, err := s.last(ctx, s.leaseSubject(id))
	if err != nil {
		return leaseState{}, err
	}
	return leaseFrom(m), nil
}

// keyState is a key as its subject's last message shows it.
type keyState struct {
	seq   uint64          // the subject's last message (0: none)
	kv    *store.KeyValue // nil unless the key exists
	lease leaseState      // of kv.Lease
}

func (s *Store) readKey(ctx context.Context, key string) (keyState, error) {
	m, err := s.last(ctx, s.keySubject(key))
	if err != nil || m == nil {
		return keyState{}, err
	}
	st := keyState{seq: m.seq}
	if isEnd(m.header) {
		return st, nil
	}
	kv := decodeKV(key, m)
	if kv.Lease != store.NoLease {
		if st.lease, err = s.lease(ctx, kv.Lease); err != nil {
			return keyState{}, err
		}
		if !st.lease.live {
			return st, nil // deleted when its lease ended
		}
	}
	st.kv = &kv
	return st, nil
}

// Get implements store.Reader.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.KeyValue{}, err
	}
	if err := s.begin(ctx); err != nil {
		return store.KeyValue{}, err
	}
	st, err := s.readKey(ctx, key)
	if err != nil {
		return store.KeyValue{}, err
	}
	if st.kv == nil {
		return store.KeyValue{}, fmt.Errorf("%w: %q", store.ErrNotFound, key)
	}
	return *st.kv, nil
}

// touch is a message that renews lease l and, in an atomic batch, makes
// the batch fail unless the lease is still the one read.
func (s *Store) touch(id store.LeaseID, l leaseState) *nats.Msg {
	m := nats.NewMsg(s.leaseSubject(id))
	m.Data = l.data
	m.Header.Set(hdrExpSubj, strconv.FormatUint(l.seq, 10))
	m.Header.Set(hdrTTL, ttlHeader(l.ttl))
	return m
}

func ttlHeader(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) + "s"
}

// publish writes m, after the lease touches in one atomic batch if there
// are any, and returns m's sequence.
func (s *Store) publish(ctx context.Context, touches []*nats.Msg, m *nats.Msg) (uint64, error) {
	return s.publishAll(ctx, append(touches, m))
}

// publishAll writes msgs, in one atomic batch if there are several, and
// returns the sequence of the last.
func (s *Store) publishAll(ctx context.Context, all []*nats.Msg) (uint64, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	m := all[len(all)-1]
	if len(all) == 1 {
		ack, err := s.js.PublishMsg(rctx, m)
		if err != nil {
			if isConflict(err) {
				return 0, err
			}
			return 0, s.fail(ctx, "write", err)
		}
		return ack.Sequence, nil
	}
	id := nuid.Next()
	for i, msg := range all {
		msg.Header.Set(hdrBatchID, id)
		msg.Header.Set(hdrBatchSeq, strconv.Itoa(i+1))
		msg.Header.Set(hdrBatchSize, strconv.Itoa(len(all)))
		if i < len(all)-1 {
			if err := s.nc.PublishMsg(msg); err != nil {
				return 0, s.unavailable("write", err)
			}
		}
	}
	m.Header.Set(hdrBatchDone, "1")
	resp, err := s.nc.RequestMsgWithContext(rctx, m)
	if err != nil {
		return 0, s.fail(ctx, "write", err)
	}
	var ack struct {
		Error *jetstream.APIError `json:"error"`
		Seq   uint64              `json:"seq"`
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return 0, fmt.Errorf("nats: malformed publish acknowledgement %q", resp.Data)
	}
	if ack.Error != nil {
		if isConflict(ack.Error) {
			return 0, ack.Error
		}
		return 0, fmt.Errorf("nats: atomic write: %w", ack.Error)
	}
	return ack.Seq, nil
}

// backoff waits a little before retrying after a conflict.
func backoff(ctx context.Context, attempt int) error {
	d := time.Duration(min(attempt, 10)) * 200 * time.Microsecond
	if !wait.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// optimistic runs try until JetStream does not refuse its write for a
// conflict (another writer changed what try read: it reads again), backing
// off between attempts, and returns try's error.
func optimistic(ctx context.Context, try func() error) error {
	for attempt := 0; ; attempt++ {
		err := try()
		if !isConflict(err) {
			return err
		}
		if err := backoff(ctx, attempt); err != nil {
			return err
		}
	}
}

// Create implements store.Writer.
func (s *Store) Create(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, mvcc.Create(key, value, opts))
}

// Put implements store.Writer.
func (s *Store) Put(ctx context.Context, key string, value []byte, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, mvcc.Put(key, value, opts))
}

// Update implements store.Writer.
func (s *Store) Update(ctx context.Context, key string, value []byte, modRevision int64, opts ...store.WriteOption) (int64, error) {
	return s.write(ctx, mvcc.Update(key, value, modRevision, opts))
}

// write reads the key (and the leases involved), checks the precondition,
// and writes with a compare-and-swap on the key's last message and on every
// lease involved; a conflict means something changed, and it starts over.
func (s *Store) write(ctx context.Context, c mvcc.Change) (int64, error) {
	if err := c.Err(); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	key := c.Key()
	var rev int64
	err := optimistic(ctx, func() error {
		st, err := s.readKey(ctx, key)
		if err != nil {
			return err
		}
		lease, err := c.Check(st.kv)
		if err != nil {
			return err
		}
		var touches []*nats.Msg
		if lease != store.NoLease {
			l, err := s.lease(ctx, lease)
			if err != nil {
				return err
			}
			if !l.live {
				return fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, lease)
			}
			touches = append(touches, s.touch(lease, l))
		}
		m := nats.NewMsg(s.keySubject(key))
		m.Data = c.Value()
		m.Header.Set(hdrExpSubj, strconv.FormatUint(st.seq, 10))
		m.Header.Set(hdrPrev, strconv.FormatUint(st.seq, 10))
		if st.kv != nil {
			m.Header.Set(hdrCreate, strconv.FormatInt(st.kv.CreateRevision, 10))
			if st.kv.Lease != store.NoLease && st.kv.Lease != lease {
				// The old lease must not end unseen before this write.
				touches = append(touches, s.touch(st.kv.Lease, st.lease))
			}
		}
		if lease != store.NoLease {
			m.Header.Set(hdrLease, fmt.Sprintf("%x", uint64(lease)))
		}
		seq, err := s.publish(ctx, touches, m)
		rev = int64(seq)
		return err
	})
	return rev, err
}

// Delete implements store.Writer.
func (s *Store) Delete(ctx context.Context, key string, opts ...store.DeleteOption) (int64, error) {
	c := mvcc.Delete(key, opts)
	if err := c.Err(); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	var rev int64
	err := optimistic(ctx, func() error {
		st, err := s.readKey(ctx, key)
		if err != nil {
			return err
		}
		if _, err := c.Check(st.kv); err != nil {
			return err
		}
		var touches []*nats.Msg
		if st.kv.Lease != store.NoLease {
			touches = append(touches, s.touch(st.kv.Lease, st.lease))
		}
		m := nats.NewMsg(s.keySubject(key))
		m.Header.Set(hdrKVOp, "DEL")
		m.Header.Set(hdrExpSubj, strconv.FormatUint(st.seq, 10))
		m.Header.Set(hdrPrev, strconv.FormatUint(st.seq, 10))
		seq, err := s.publish(ctx, touches, m)
		rev = int64(seq)
		return err
	})
	return rev, err
}

// Grant implements store.Leaser. The TTL is rounded up to whole seconds.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateTTL(ttl); err != nil {
		return store.Lease{}, err
	}
	if err := s.begin(ctx); err != nil {
		return store.Lease{}, err
	}
	// The server raises message TTLs to the marker TTL.
	ttl = max((ttl + time.Second - 1).Truncate(time.Second), s.markerTTL)
	data, _ := json.Marshal(leaseRecord{TTLMillis: ttl.Milliseconds()})
	for range 10 {
		var r [8]byte
		_, _ = rand.Read(r[:])
		id := store.LeaseID(binary.LittleEndian.Uint64(r[:]) >> 1)
		if id == store.NoLease {
			continue
		}
		m := nats.NewMsg(s.leaseSubject(id))
		m.Data = data
		m.Header.Set(hdrExpSubj, "0") // a fresh ID
		m.Header.Set(hdrTTL, ttlHeader(ttl))
		_, err := s.publish(ctx, nil, m)
		if isConflict(err) {
			continue
		}
		if err != nil {
			return store.Lease{}, err
		}
		return store.Lease{ID: id, TTL: ttl}, nil
	}
	return store.Lease{}, errors.New("nats: cannot grant a lease: no free lease ID after 10 attempts")
}

// KeepAlive implements store.Leaser: it writes the lease record again with
// a fresh TTL.
func (s *Store) KeepAlive(ctx context.Context, id store.LeaseID) (time.Duration, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	var ttl time.Duration
	err := optimistic(ctx, func() error {
		l, err := s.lease(ctx, id)
		if err != nil {
			return err
		}
		if !l.live {
			return fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
		}
		_, err = s.publish(ctx, nil, s.touch(id, l))
		ttl = l.ttl
		return err
	})
	if err != nil {
		return 0, err
	}
	return ttl, nil
}

// Revoke implements store.Leaser: one message ends the lease, and with it
// (at that revision) every key bound to it.
func (s *Store) Revoke(ctx context.Context, id store.LeaseID) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return optimistic(ctx, func() error {
		l, err := s.lease(ctx, id)
		if err != nil {
			return err
		}
		if !l.live {
			return fmt.Errorf("%w: lease %x", store.ErrLeaseNotFound, id)
		}
		m := nats.NewMsg(s.leaseSubject(id))
		m.Header.Set(hdrKVOp, "PURGE")
		m.Header.Set(hdrTTL, ttlHeader(s.markerTTL))
		m.Header.Set(hdrExpSubj, strconv.FormatUint(l.seq, 10))
		_, err = s.publish(ctx, nil, m)
		return err
	})
}

// snapshotAt reads the last message of every key under prefix as of upTo
// (0: now) and returns them with the revision they are as of.
func (s *Store) snapshotAt(ctx context.Context, prefix string, upTo uint64) ([]rawMsg, uint64, error) {
	filter, _ := prefixFilter(prefix)
	filter = s.pre + "k." + filter
	msgs, rev, err := s.multiLast(ctx, []string{filter, s.metaSubject()}, upTo)
	if !errors.Is(err, errTooMany) {
		return msgs, rev, err
	}
	// More than the server returns at once: fix the revision, list the
	// subjects, and read them in chunks as of that revision.
	if upTo == 0 {
		if _, upTo, err = s.multiLast(ctx, []string{s.metaSubject()}, 0); err != nil {
			return nil, 0, err
		}
	}
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	st, err := s.js.Stream(rctx, s.stream)
	if err != nil {
		return nil, 0, s.fail(ctx, "list subjects", err)
	}
	info, err := st.Info(rctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, 0, s.unavailable("list subjects", err)
	}
	subjects := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		subjects = append(subjects, subj)
	}
	slices.Sort(subjects)
	msgs = nil
	for len(subjects) > 0 {
		n := min(len(subjects), 1000)
		part, _, err := s.multiLast(ctx, subjects[:n], upTo)
		if err != nil {
			return nil, 0, err
		}
		msgs = append(msgs, part...)
		subjects = subjects[n:]
	}
	return msgs, upTo, nil
}

// List implements store.Reader. The keys come from one read of the
// bucket isolated from writes (up to 1024 subjects; larger prefixes are
// read in chunks as of one revision), and the leases they are bound to are
// checked as of that revision.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KeyValue, int64, error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, 0, err
	}
	if err := s.begin(ctx); err != nil {
		return nil, 0, err
	}
	msgs, rev, err := s.snapshotAt(ctx, prefix, 0)
	if err != nil {
		return nil, 0, err
	}
	keyPre := s.pre + "k."
	var out []store.KeyValue
	leases := map[store.LeaseID]bool{}
	phys := map[string]uint64{} // leased key → sequence of its message
	for i := range msgs {
		m := &msgs[i]
		tokens, ok := strings.CutPrefix(m.subject, keyPre)
		if !ok || isEnd(m.header) {
			continue
		}
		key, err := decodeKey(tokens)
		if err != nil || !strings.HasPrefix(key, prefix) {
			continue
		}
		kv := decodeKV(key, m)
		if kv.Lease != store.NoLease {
			leases[kv.Lease] = true
			phys[key] = m.seq
		}
		out = append(out, kv)
	}
	if len(leases) > 0 {
		alive, err := s.leasesAliveAt(ctx, leases, rev)
		if err != nil {
			return nil, 0, err
		}
		var dead []store.KeyValue
		out = slices.DeleteFunc(out, func(kv store.KeyValue) bool {
			if kv.Lease != store.NoLease && !alive[kv.Lease] {
				dead = append(dead, kv)
				return true
			}
			return false
		})
		s.reap(ctx, dead, phys)
	}
	slices.SortFunc(out, func(a, b store.KeyValue) int { return strings.Compare(a.Key, b.Key) })
	return out, int64(rev), nil
}

// leasesAliveAt reports which leases were alive at revision rev, from
// their current state: a lease never comes back, so one alive now was
// alive then, and one that ended after rev was alive then too.
func (s *Store) leasesAliveAt(ctx context.Context, ids map[store.LeaseID]bool, rev uint64) (map[store.LeaseID]bool, error) {
	subjects := make([]string, 0, len(ids))
	for id := range ids {
		subjects = append(subjects, s.leaseSubject(id))
	}
	alive := make(map[store.LeaseID]bool, len(ids))
	for len(subjects) > 0 {
		n := min(len(subjects), 1000)
		msgs, _, err := s.multiLast(ctx, append(subjects[:n:n], s.metaSubject()), 0)
		if err != nil {
			return nil, err
		}
		for i := range msgs {
			hex, ok := strings.CutPrefix(msgs[i].subject, s.pre+"l.")
			if !ok {
				continue
			}
			l := leaseFrom(&msgs[i])
			alive[parseLeaseID(hex)] = l.live || l.endSeq > rev
		}
		subjects = subjects[n:]
	}
	return alive, nil
}

// Compact implements store.Compactor: it raises the bucket's compaction
// watermark, below which watches (of every client) fail with
// store.ErrCompacted.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return optimistic(ctx, func() error {
		msgs, now, err := s.multiLast(ctx, []string{s.metaSubject(), s.compactSubject()}, 0)
		if err != nil {
			return err
		}
		var cur int64 = 1
		var curSeq uint64
		for i := range msgs {
			if msgs[i].subject == s.compactSubject() {
				cur, _ = strconv.ParseInt(string(msgs[i].data), 10, 64)
				curSeq = msgs[i].seq
			}
		}
		switch {
		case rev > int64(now):
			return fmt.Errorf("store: cannot compact to revision %d: the current revision is %d", rev, now)
		case rev <= cur:
			return &store.CompactedError{Requested: rev, CompactRevision: cur}
		}
		m := nats.NewMsg(s.compactSubject())
		m.Data = []byte(strconv.FormatInt(rev, 10))
		m.Header.Set(hdrExpSubj, strconv.FormatUint(curSeq, 10))
		_, err = s.publish(ctx, nil, m)
		return err
	})
}

// reapLater reaps in the background (ended by Close).
func (s *Store) reapLater(kvs []store.KeyValue, phys map[string]uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(kvs) == 0 {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.reap(s.bg, kvs, phys)
	}()
}

// reap deletes keys whose lease has ended (they are gone already; this
// frees their messages). The deletions are marked, and watches skip them.
func (s *Store) reap(ctx context.Context, kvs []store.KeyValue, phys map[string]uint64) {
	for _, kv := range kvs {
		seq := strconv.FormatUint(phys[kv.Key], 10)
		m := nats.NewMsg(s.keySubject(kv.Key))
		m.Header.Set(hdrKVOp, "DEL")
		m.Header.Set(hdrReap, fmt.Sprintf("%x", uint64(kv.Lease)))
		m.Header.Set(hdrExpSubj, seq)
		m.Header.Set(hdrPrev, seq)
		if _, err := s.publish(ctx, nil, m); err != nil && !isConflict(err) {
			return
		}
	}
}

// sortKeys returns the map's keys in order.
func sortKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Txn implements store.Transactor with one atomic batch: a message per
// write (with a compare-and-swap on each key's last message) plus the
// touches of the leases involved. The batch's messages get consecutive
// sequences; all of them carry the revision of the last one.
func (s *Store) Txn(ctx context.Context, ops ...store.Op) (int64, error) {
	if err := store.ValidateOps(ops); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	var rev int64
	err := optimistic(ctx, func() error {
		states := make([]keyState, len(ops))
		for i, op := range ops {
			var err error
			if states[i], err = s.readKey(ctx, op.Key); err != nil {
				return err
			}
			if err := mvcc.CheckOp(op, states[i].kv); err != nil {
				return err
			}
		}
		var touches, writes []*nats.Msg
		touched := map[store.LeaseID]bool{}
		touch := func(id store.LeaseID, l leaseState) {
			if !touched[id] {
				touched[id] = true
				touches = append(touches, s.touch(id, l))
			}
		}
		for i, op := range ops {
			st := states[i]
			m := nats.NewMsg(s.keySubject(op.Key))
			seq := strconv.FormatUint(st.seq, 10)
			m.Header.Set(hdrExpSubj, seq)
			m.Header.Set(hdrPrev, seq)
			if st.kv != nil && st.kv.Lease != store.NoLease && (op.Kind == store.OpDelete || st.kv.Lease != op.Lease) {
				touch(st.kv.Lease, st.lease)
			}
			switch {
			case op.Kind == store.OpPut:
				if op.Lease != store.NoLease && !touched[op.Lease] {
					l, err := s.lease(ctx, op.Lease)
					if err != nil {
						return err
					}
					if !l.live {
						return fmt.Errorf("%w: lease %x (for %q)", store.ErrLeaseNotFound, op.Lease, op.Key)
					}
					touch(op.Lease, l)
				}
				m.Data = op.Value
				if st.kv != nil {
					m.Header.Set(hdrCreate, strconv.FormatInt(st.kv.CreateRevision, 10))
				}
				if op.Lease != store.NoLease {
					m.Header.Set(hdrLease, fmt.Sprintf("%x", uint64(op.Lease)))
				}
			case st.kv != nil:
				m.Header.Set(hdrKVOp, "DEL")
			default:
				continue // deleting an absent key does nothing
			}
			writes = append(writes, m)
		}
		if len(writes) == 0 {
			_, now, err := s.multiLast(ctx, []string{s.metaSubject()}, 0)
			rev = int64(now)
			return err
		}
		seq, err := s.publishAll(ctx, append(touches, writes...))
		rev = int64(seq)
		return err
	})
	return rev, err
}
