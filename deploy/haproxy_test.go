package deploy

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/coordd/coordd/internal/testing/haproxytest"
)

// tcpChecks returns the arguments of haproxy.cfg's tcp-check lines of the
// given kind ("send-binary", "expect"), in order.
func tcpChecks(t *testing.T, cfg, kind string) []string {
	t.Helper()
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s*tcp-check\s+`+regexp.QuoteMeta(kind)+`\s+(.+?)\s*$`).FindAllStringSubmatch(cfg, -1) {
		out = append(out, m[1])
	}
	return out
}

// grpcFrame prefixes a message as gRPC does: uncompressed, 4-byte length.
func grpcFrame(msg []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))), msg...)
}

// TestHAProxyHealthCheck decodes the raw HTTP/2 bytes haproxy.cfg sends as
// its health check and checks that they are a well-formed gRPC call of
// grpc.health.v1.Health/Check for the overall service, and that the
// expected answer is exactly the encoding of status SERVING and nothing
// else, NOT_SERVING in particular; `haproxy -c` checks the file's syntax
// (haproxy is required: `make deps` installs it).
func TestHAProxyHealthCheck(t *testing.T) {
	cfg := readFile(t, "haproxy/haproxy.cfg")
	sends := tcpChecks(t, cfg, "send-binary")
	if len(sends) != 1 {
		t.Fatalf("tcp-check send-binary lines = %d; want 1", len(sends))
	}
	raw, err := hex.DecodeString(sends[0])
	if err != nil {
		t.Fatalf("send-binary: %v", err)
	}
	rest, ok := bytes.CutPrefix(raw, []byte(http2.ClientPreface))
	if !ok {
		t.Fatal("send-binary does not start with the HTTP/2 client preface")
	}
	fr := http2.NewFramer(io.Discard, bytes.NewReader(rest))
	headers := map[string]string{}
	var body []byte
	var settings, ended bool
	for {
		f, err := fr.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("send-binary: HTTP/2 frame: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			settings = !f.IsAck()
		case *http2.HeadersFrame:
			if f.StreamID != 1 || !f.HeadersEnded() {
				t.Fatalf("HEADERS on stream %d, END_HEADERS %v; want stream 1, one frame", f.StreamID, f.HeadersEnded())
			}
			fields, err := hpack.NewDecoder(4096, nil).DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				t.Fatalf("HEADERS: HPACK: %v", err)
			}
			for _, hf := range fields {
				headers[hf.Name] = hf.Value
			}
		case *http2.DataFrame:
			body = append(body, f.Data()...)
			ended = f.StreamEnded()
		default:
			t.Fatalf("unexpected frame %v", f.Header())
		}
	}
	if !settings {
		t.Error("no SETTINGS frame after the preface")
	}
	for name, want := range map[string]string{
		":method": "POST", ":scheme": "http", ":path": "/grpc.health.v1.Health/Check",
		"content-type": "application/grpc", "te": "trailers",
	} {
		if got := headers[name]; got != want {
			t.Errorf("header %s = %q; want %q", name, got, want)
		}
	}
	if headers[":authority"] == "" {
		t.Error("no :authority; grpc-go refuses such a call")
	}
	req := new(healthpb.HealthCheckRequest)
	if len(body) < 5 || !bytes.Equal(body, grpcFrame(body[5:])) || proto.Unmarshal(body[5:], req) != nil || req.GetService() != "" || !ended {
		t.Errorf("DATA %x (END_STREAM %v); want one gRPC frame of a HealthCheckRequest for service \"\", ending the stream", body, ended)
	}

	// The answers' gRPC messages, as the test's own encoding makes them.
	answer := func(s healthpb.HealthCheckResponse_ServingStatus) []byte {
		b, err := proto.Marshal(&healthpb.HealthCheckResponse{Status: s})
		if err != nil {
			t.Fatal(err)
		}
		return grpcFrame(b)
	}
	serving, notServing := answer(healthpb.HealthCheckResponse_SERVING), answer(healthpb.HealthCheckResponse_NOT_SERVING)
	expects := tcpChecks(t, cfg, "expect")
	if len(expects) != 2 {
		t.Fatalf("tcp-check expect lines = %q; want 2", expects)
	}
	// First: wait until either status arrived (rbinary: a regex on the hex).
	wait, ok := strings.CutPrefix(expects[0], "rbinary ")
	if !ok {
		t.Fatalf("first expect %q; want rbinary", expects[0])
	}
	re := regexp.MustCompile(wait)
	for _, a := range [][]byte{serving, notServing} {
		if !re.MatchString(hex.EncodeToString(a)) {
			t.Errorf("first expect %q does not match the answer %x", wait, a)
		}
	}
	// Then: SERVING, matched at once.
	pass, ok := strings.CutPrefix(expects[1], "min-recv ")
	if !ok {
		t.Fatalf("second expect %q; want min-recv N binary HEX (no waiting on a mismatch)", expects[1])
	}
	_, pass, _ = strings.Cut(pass, " binary ")
	want, err := hex.DecodeString(pass)
	if err != nil || !bytes.Equal(want, serving) {
		t.Errorf("second expect matches %s; want %x, status SERVING", pass, serving)
	}

	out, err := exec.Command(haproxytest.Path(t), "-c", "-f", "haproxy/haproxy.cfg").CombinedOutput()
	if err != nil {
		t.Errorf("haproxy -c: %v\n%s", err, out)
	}
}

// TestHAProxyMCPConfig: `haproxy -c` accepts mcp.cfg.
func TestHAProxyMCPConfig(t *testing.T) {
	out, err := exec.Command(haproxytest.Path(t), "-c", "-f", "haproxy/mcp.cfg").CombinedOutput()
	if err != nil {
		t.Errorf("haproxy -c: %v\n%s", err, out)
	}
}
