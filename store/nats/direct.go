package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// rawMsg is a stream message read with the direct get API.
type rawMsg struct {
	subject string
	seq     uint64
	time    time.Time
	header  nats.Header
	data    []byte
}

// errTooMany is a multi-subject read that matched more subjects than the
// server returns in one response.
var errTooMany = errors.New("nats: too many subjects for one read")

// reqCtx bounds one request by the request timeout, by ctx, and by Close:
// no request outlives the store.
func (s *Store) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	stop := context.AfterFunc(s.bg, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

func parseRaw(m *nats.Msg) (rawMsg, error) {
	r := rawMsg{subject: m.Header.Get("Nats-Subject"), header: m.Header, data: m.Data}
	seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil || seq == 0 || r.subject == "" { // stream sequences start at 1
		return rawMsg{}, fmt.Errorf("nats: malformed direct get response (subject %q, sequence %q)", r.subject, m.Header.Get("Nats-Sequence"))
	}
	r.seq = seq
	r.time, _ = time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
	return r, nil
}

// last returns the last message of subject, or nil if it has none.
func (s *Store) last(ctx context.Context, subject string) (*rawMsg, error) {
	return s.directGet(ctx, s.directPre+"."+subject, nil, "of "+subject)
}

// directGet sends one direct get request (body to subject) and returns the
// message it answers, or nil if there is none (404); what names the read
// in errors ("of SUBJECT").
func (s *Store) directGet(ctx context.Context, subject string, body []byte, what string) (*rawMsg, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	m, err := s.nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		return nil, s.fail(ctx, "read", err)
	}
	switch st := m.Header.Get("Status"); st {
	case "":
	case "404":
		return nil, nil
	default:
		return nil, fmt.Errorf("nats: direct get %s: status %s %s", what, st, m.Header.Get("Description"))
	}
	r, err := parseRaw(m)
	return &r, err
}

// getReq is the direct get request of the JetStream API.
type getReq struct {
	Seq       uint64     `json:"seq,omitempty"`
	NextFor   string     `json:"next_by_subj,omitempty"`
	MultiLast []string   `json:"multi_last,omitempty"`
	UpToSeq   uint64     `json:"up_to_seq,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
	Batch     int        `json:"batch,omitempty"`
}

// bySeq returns the message at seq, or nil if there is none.
func (s *Store) bySeq(ctx context.Context, seq uint64) (*rawMsg, error) {
	body, _ := json.Marshal(getReq{Seq: seq})
	return s.directGet(ctx, s.directPre, body, fmt.Sprintf("of sequence %d", seq))
}

// firstSince returns the first message stored at or after t, or nil.
func (s *Store) firstSince(ctx context.Context, t time.Time) (*rawMsg, error) {
	body, _ := json.Marshal(getReq{StartTime: &t})
	return s.directGet(ctx, s.directPre, body, "by time")
}

// multiLast returns the last message of every subject matching the
// filters, as of upTo (0: now), read in isolation from writes, and the
// sequence the read was as of. It fails with errTooMany beyond the server's
// limit (1024 subjects).
func (s *Store) multiLast(ctx context.Context, filters []string, upTo uint64) ([]rawMsg, uint64, error) {
	rctx, cancel := s.reqCtx(ctx)
	defer cancel()
	inbox := s.nc.NewRespInbox()
	sub, err := s.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, 0, s.unavailable("read", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(getReq{MultiLast: filters, UpToSeq: upTo})
	if err := s.nc.PublishRequest(s.directPre, inbox, body); err != nil {
		return nil, 0, s.unavailable("read", err)
	}
	var out []rawMsg
	for {
		m, err := sub.NextMsgWithContext(rctx)
		if err != nil {
			return nil, 0, s.fail(ctx, "read", err)
		}
		switch st := m.Header.Get("Status"); st {
		case "":
			r, err := parseRaw(m)
			if err != nil {
				return nil, 0, err
			}
			out = append(out, r)
			continue
		case "204": // end of batch
			n, err := strconv.ParseUint(m.Header.Get("Nats-UpTo-Sequence"), 10, 64)
			if err != nil {
				return nil, 0, errors.New("nats: direct get batch without Nats-UpTo-Sequence: the server is older than 2.11")
			}
			return out, n, nil
		case "404":
			if upTo == 0 {
				return nil, 0, errors.New("nats: direct get of no subject: the bucket lost its meta subject")
			}
			return nil, upTo, nil
		case "413":
			return nil, 0, errTooMany
		default:
			return nil, 0, fmt.Errorf("nats: direct get batch: status %s %s", st, m.Header.Get("Description"))
		}
	}
}
