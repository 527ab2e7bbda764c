package redistest

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalTB records Fatalf instead of failing the real test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestStartWithoutRedisServerFails(t *testing.T) {
	if testing.Short() {
		t.Skip("under -short Start skips before it looks for redis-server")
	}
	t.Setenv("PATH", t.TempDir())
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(f)
		t.Error("Start returned without redis-server on PATH")
	}()
	<-done
	if !strings.Contains(f.msg, installHint) {
		t.Fatalf("Fatalf message = %q; want it to contain %q", f.msg, installHint)
	}
}

func TestRestartWaitsForPortHolder(t *testing.T) {
	s := Start(t)
	s.Kill()
	// Something else grabs the port while the server is down.
	l, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatalf("listen on %s: %v", s.Addr(), err)
	}
	time.AfterFunc(300*time.Millisecond, func() { l.Close() })
	if err := s.TryRestart(); err != nil {
		t.Fatalf("TryRestart: %v", err)
	}
	if !strings.Contains(s.Output(), "Address already in use") {
		t.Errorf("expected at least one failed bind before success; output:\n%s", s.Output())
	}
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("PING after TryRestart: %v", err)
	}
}
