package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Watch is one etcd watch stream (gRPC's /etcdserverpb.Watch/Watch)
// spoken over a bare HTTP/2 connection: one goroutine reads the frames
// and splits the gRPC messages out of them, with none of a gRPC client's
// per-message work (a goroutine hop, a header wait, a buffer per
// message). Only what a watch needs: one stream, flow control, SETTINGS
// and PING answered.
type h2Watch struct {
	conn net.Conn
	fr   *http2.Framer

	wmu  sync.Mutex // writes: the opener's requests, the reader's answers
	bw   *bufio.Writer
	cond *sync.Cond // the send window grew, or the connection ended (on wmu)
	// send windows (connection, stream) and their initial size; ended
	// once the reader stopped.
	connWin, streamWin, initWin int64
	ended                       bool

	carry    []byte // the start of a gRPC message split over DATA frames
	consumed int64  // bytes read since the last WINDOW_UPDATE
}

const (
	h2StreamID   = 1
	h2RecvWindow = 1 << 30 // what the reader lets the server send ahead
	h2Replenish  = 16 << 20
)

// dialH2Watch connects to host and opens the watch stream.
func dialH2Watch(ctx context.Context, host string) (*h2Watch, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, fmt.Errorf("bench: dial %s: %w", host, err)
	}
	w := &h2Watch{conn: c, bw: bufio.NewWriterSize(c, 32<<10), connWin: 65535, streamWin: 65535, initWin: 65535}
	w.cond = sync.NewCond(&w.wmu)
	w.fr = http2.NewFramer(w.bw, bufio.NewReaderSize(c, 64<<10))
	w.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/etcdserverpb.Watch/Watch"},
		{":authority", host}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_, err = w.bw.WriteString(http2.ClientPreface)
	err = errors.Join(err,
		w.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2RecvWindow}),
		w.fr.WriteWindowUpdate(0, h2RecvWindow-65535),
		w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h2StreamID, BlockFragment: hdr.Bytes(), EndHeaders: true}),
		w.bw.Flush())
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("bench: watch stream to %s: %w", host, err)
	}
	return w, nil
}

// send writes msg (a marshalled request) as one gRPC message, waiting for
// the server's flow-control window.
func (w *h2Watch) send(msg []byte) error {
	buf := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(buf[1:], uint32(len(msg)))
	copy(buf[5:], msg)
	w.wmu.Lock()
	defer w.wmu.Unlock()
	need := int64(len(buf))
	for !w.ended && (w.connWin < need || w.streamWin < need) {
		w.cond.Wait()
	}
	if w.ended {
		return errors.New("watch stream ended")
	}
	w.connWin -= need
	w.streamWin -= need
	if err := w.fr.WriteData(h2StreamID, false, buf); err != nil {
		return err
	}
	return w.bw.Flush()
}

// read reads frames until the stream or the connection ends, calling
// onMsg with each gRPC message received (valid only during the call).
func (w *h2Watch) read(onMsg func([]byte) error) error {
	defer func() {
		w.wmu.Lock()
		w.ended = true
		w.cond.Broadcast()
		w.wmu.Unlock()
	}()
	for {
		f, err := w.fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			if err := w.data(f, onMsg); err != nil {
				return err
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				return fmt.Errorf("watch stream ended: grpc-status %s: %s", headerValue(f, "grpc-status"), headerValue(f, "grpc-message"))
			}
		case *http2.SettingsFrame:
			if err := w.settings(f); err != nil {
				return err
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := w.write(func() error { return w.fr.WritePing(true, f.Data) }); err != nil {
					return err
				}
			}
		case *http2.WindowUpdateFrame:
			w.wmu.Lock()
			if f.StreamID == 0 {
				w.connWin += int64(f.Increment)
			} else {
				w.streamWin += int64(f.Increment)
			}
			w.cond.Broadcast()
			w.wmu.Unlock()
		case *http2.RSTStreamFrame:
			return fmt.Errorf("watch stream reset: %v", f.ErrCode)
		case *http2.GoAwayFrame:
			return fmt.Errorf("server went away: %v %s", f.ErrCode, f.DebugData())
		}
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if strings.EqualFold(hf.Name, name) {
			return hf.Value
		}
	}
	return ""
}

// data splits a DATA frame into gRPC messages (a 5-byte prefix: a
// compression flag, the length), and gives the window back.
func (w *h2Watch) data(f *http2.DataFrame, onMsg func([]byte) error) error {
	b := f.Data()
	w.consumed += int64(f.Length)
	if len(w.carry) > 0 {
		w.carry = append(w.carry, b...)
		b = w.carry
	}
	for len(b) >= 5 {
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if b[0] != 0 {
			return errors.New("watch stream: a compressed message (none was asked for)")
		}
		if len(b) < 5+n {
			break
		}
		if err := onMsg(b[5 : 5+n]); err != nil {
			return err
		}
		b = b[5+n:]
	}
	w.carry = append(w.carry[:0], b...) // b may be in carry: copy handles the overlap
	if f.StreamEnded() {
		return errors.New("watch stream ended by the server")
	}
	if w.consumed >= h2Replenish {
		n := uint32(w.consumed)
		w.consumed = 0
		return w.write(func() error {
			return errors.Join(w.fr.WriteWindowUpdate(0, n), w.fr.WriteWindowUpdate(h2StreamID, n))
		})
	}
	return nil
}

// settings applies the server's SETTINGS (its initial stream window) and
// acknowledges them.
func (w *h2Watch) settings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
		w.wmu.Lock()
		w.streamWin += int64(v) - w.initWin
		w.initWin = int64(v)
		w.cond.Broadcast()
		w.wmu.Unlock()
	}
	return w.write(func() error { return w.fr.WriteSettingsAck() })
}

// write runs fn (frame writes) under wmu and flushes.
func (w *h2Watch) write(fn func() error) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if err := fn(); err != nil {
		return err
	}
	return w.bw.Flush()
}

// close ends the connection (the reader returns).
func (w *h2Watch) close() error { return w.conn.Close() }
