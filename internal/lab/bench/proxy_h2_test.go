package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// grpcMsg frames b as one gRPC message.
func grpcMsg(b string) []byte {
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

// TestH2WatchFraming: the benchmark's bare HTTP/2 watch stream opens
// with the preface, its SETTINGS and the watch's HEADERS; sends requests
// as gRPC messages in DATA frames; hands over every gRPC message whole
// and in order however the server's DATA frames cut them (one message
// over two frames, two in one); answers a PING; and ends with the
// trailers' grpc-status and message.
func TestH2WatchFraming(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := dialH2Watch(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		t.Fatalf("preface %q: %v", preface, err)
	}
	srv := http2.NewFramer(c, c)
	srv.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var path string
	for path == "" {
		f, err := srv.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			path = h.PseudoValue("path")
		}
	}
	if path != "/etcdserverpb.Watch/Watch" {
		t.Fatalf("stream opened on %q", path)
	}
	if err := w.send([]byte("create")); err != nil {
		t.Fatal(err)
	}
	f, err := srv.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := f.(*http2.DataFrame); !ok || !bytes.Equal(d.Data(), grpcMsg("create")) {
		t.Fatalf("request frame %v", f)
	}
	a, bc := grpcMsg("first, cut in two"), append(grpcMsg("second"), grpcMsg("third")...)
	for _, err := range []error{srv.WriteSettings(), srv.WriteData(h2StreamID, false, a[:7]), srv.WriteData(h2StreamID, false, a[7:]),
		srv.WritePing(false, [8]byte{1, 2, 3}), srv.WriteData(h2StreamID, false, bc)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	_ = enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "8"})
	_ = enc.WriteField(hpack.HeaderField{Name: "grpc-message", Value: "too slow"})
	if err := srv.WriteHeaders(http2.HeadersFrameParam{StreamID: h2StreamID, BlockFragment: hdr.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
		t.Fatal(err)
	}
	var got []string
	err = w.read(func(b []byte) error { got = append(got, string(b)); return nil })
	if strings.Join(got, "|") != "first, cut in two|second|third" {
		t.Errorf("messages %q", got)
	}
	if err == nil || !strings.Contains(err.Error(), "grpc-status 8: too slow") {
		t.Errorf("end: %v", err)
	}
	for {
		f, err := srv.ReadFrame()
		if err != nil {
			t.Fatalf("no PING answered: %v", err)
		}
		if p, ok := f.(*http2.PingFrame); ok {
			if !p.IsAck() || p.Data != [8]byte{1, 2, 3} {
				t.Fatalf("ping answer %+v", p)
			}
			return
		}
	}
}
