// Package redistest runs real redis-server processes for tests.
//
// It is the one helper every coordd test uses to get a Redis: each call to
// Start launches a private redis-server on a free loopback port with
// persistence off and a data directory under t.TempDir(), and tears it down
// when the test ends. Tests never touch a Redis already running on the
// machine (such as one on 127.0.0.1:6379).
//
// Faults are injected on the process itself: Kill (crash, data lost),
// Restart (come back empty on the same address), Pause/Resume (a frozen
// Redis that accepts connections but never answers).
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds how long Start and Restart wait for PING.
	startTimeout = 5 * time.Second
	// stopTimeout bounds how long Stop waits for a graceful shutdown
	// before it falls back to SIGKILL.
	stopTimeout = 5 * time.Second
	// bindAttempts is how many ports Start tries, and how many times
	// Restart retries its port, when the bind loses a race.
	bindAttempts = 5
	// outputTail is how much of redis-server's output failure messages quote.
	outputTail = 4 << 10
)

// installHint is the message given when redis-server is missing.
const installHint = "redis-server not found on PATH; install it with `sudo apt-get install -y redis-server` (or run `make test`, which installs it)"

// errAddrInUse reports that redis-server exited because its port was taken.
var errAddrInUse = errors.New("redistest: address already in use")

// Option configures Start.
type Option func(*config)

type config struct {
	args        []string
	cluster     bool          // run with --cluster-enabled yes on a second free port for the bus
	nodeTimeout time.Duration // cluster: --cluster-node-timeout; 0: 5s
	sentinel    string        // run as a Sentinel with this configuration file
}

// WithArgs appends command-line arguments to redis-server, after the ones
// Start sets itself, so they win: WithArgs("--maxmemory", "10mb",
// "--maxmemory-policy", "allkeys-lru"). Do not pass --port, --bind or --dir.
// A server started with --requirepass counts as up when it answers PING
// with NOAUTH; give its clients the password.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// WithClusterNodeTimeout sets a cluster node's --cluster-node-timeout
// (default 5s): a node silent for that long is suspected, and once a
// majority of masters agree, failed; a failed master's replica is promoted
// about a second later. It applies to StartCluster and
// StartClusterWithReplicas only.
func WithClusterNodeTimeout(d time.Duration) Option {
	return func(c *config) { c.nodeTimeout = d }
}

// SkipShort skips the test under go test -short, whatever is installed:
// the short loop runs only tests that start no redis-server. A TB that
// cannot skip (a program that is not a test) is never skipped. Call it
// from the test goroutine.
func SkipShort(t TB) {
	if !testing.Testing() || !testing.Short() {
		return
	}
	if s, ok := t.(interface{ Skip(args ...any) }); ok {
		t.Helper()
		s.Skip("needs redis-server: not run under -short")
	}
}

// TB is the part of testing.TB that Start needs. A *testing.T or
// *testing.B is one; a program that is not a test (cmd/coordbench) passes
// its own, whose Fatalf must not return and whose Cleanup functions it runs
// before exiting.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}

// Server is one redis-server process owned by a test.
//
// All methods are safe for concurrent use, including from goroutines the
// test starts. Lifecycle methods (Kill, Restart, Pause, Resume, Stop) are
// serialised: each one finishes before the next begins. The address never
// changes, so clients built before a Kill reconnect after a Restart.
type Server struct {
	t    TB
	bin  string
	port int
	dir  string
	args []string // full argument list, fixed at Start
	out  *syncBuffer

	mu     sync.Mutex // protects the fields below and serialises lifecycle methods
	proc   *process   // nil when no process is running
	paused bool
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned
	err  error         // cmd.Wait's result; read only after done is closed
}

// Start launches redis-server on a free 127.0.0.1 port and waits (at most
// 5s) until it answers PING. The server runs with --save "" --appendonly no,
// so nothing survives Kill or Restart. It is killed when the test ends.
//
// If redis-server is not on PATH, or does not come up, Start calls
// t.Fatalf, so call it from the test goroutine. It skips only under go
// test -short, whatever is installed: the short loop starts no process.
func Start(t TB, opts ...Option) *Server {
	t.Helper()
	SkipShort(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: %s", installHint)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), out: &syncBuffer{}}
	// Registered after t.TempDir, so it runs first: the process is gone
	// before its directory is removed.
	t.Cleanup(func() {
		s.Kill()
		if t.Failed() {
			t.Logf("redistest: redis-server on %s output:\n%s", s.Addr(), s.out.tail(outputTail))
		}
	})

	var lastErr error
	for range bindAttempts {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: pick a free port: %v", err)
		}
		s.port = port
		s.args = []string{
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--save", "",
			"--appendonly", "no",
			"--dir", s.dir,
			"--daemonize", "no",
			"--logfile", "",
		}
		if cfg.cluster {
			bus, err := freePort()
			for err == nil && bus == port {
				bus, err = freePort()
			}
			if err != nil {
				t.Fatalf("redistest: pick a free port: %v", err)
			}
			timeout := cfg.nodeTimeout
			if timeout <= 0 {
				timeout = 5 * time.Second
			}
			s.args = append(s.args,
				"--cluster-enabled", "yes",
				"--cluster-port", strconv.Itoa(bus),
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
			)
		}
		if cfg.sentinel != "" {
			// The configuration file must come first; Sentinel rewrites it.
			s.args = append([]string{cfg.sentinel, "--sentinel"}, s.args...)
		}
		s.args = append(s.args, cfg.args...)
		s.mu.Lock()
		lastErr = s.startLocked()
		s.mu.Unlock()
		if lastErr == nil {
			return s
		}
		if !errors.Is(lastErr, errAddrInUse) {
			break
		}
	}
	t.Fatalf("redistest: start redis-server: %v\noutput:\n%s", lastErr, s.out.tail(outputTail))
	return nil
}

// Addr returns the server's address as host:port, e.g. "127.0.0.1:41234".
// It stays the same across Kill and Restart.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL returns the server's address as a redis URL for database 0,
// e.g. "redis://127.0.0.1:41234/0", suitable for redis.ParseURL.
func (s *Server) URL() string {
	return "redis://" + s.Addr() + "/0"
}

// Client returns a go-redis client for the server, closed when t ends.
// Each opt may adjust the options (timeouts, retries) before the client is
// built; Addr is already set. Otherwise go-redis defaults apply: a command
// against a paused server waits out the 5s ReadTimeout, so fault tests
// usually shorten it. After PoolSize failed dials (say, many commands
// against a killed server) go-redis stops dialing and returns its last dial
// error until a background probe, about once a second, gets through, so
// commands may keep failing briefly after Restart.
func (s *Server) Client(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: s.Addr()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Output returns everything redis-server has written to stdout and stderr
// across all its runs.
func (s *Server) Output() string {
	return s.out.String()
}

// Running reports whether a redis-server process is alive (paused counts as
// alive).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// Kill sends SIGKILL and waits for the process to exit: a crash, with every
// key lost. Clients get connection errors until Restart. Killing a stopped
// server is a no-op.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// Stop shuts the server down gracefully (SIGTERM, resuming it first if it
// is paused) and waits for it to exit, falling back to SIGKILL after 5s.
// Stopping a stopped server is a no-op.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if s.paused {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
	}
	select {
	case <-p.done:
		s.proc, s.paused = nil, false
	case <-time.After(stopTimeout):
		s.killLocked()
	}
}

// Restart starts redis-server again on the same address, with the same
// arguments and directory, and waits (at most 5s) until it answers PING.
// A running server is killed first. Since persistence is off, the restarted
// server is empty. It retries while the port is briefly held by another
// socket.
//
// Restart reports failure with t.Fatalf, so call it from the test
// goroutine; from other goroutines use TryRestart.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.TryRestart(); err != nil {
		s.t.Fatalf("%v", err)
	}
}

// TryRestart is Restart returning its error instead of failing the test,
// for use from goroutines other than the test's own.
func (s *Server) TryRestart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
	var err error
	deadline := time.Now().Add(startTimeout)
	for attempt := 0; ; attempt++ {
		err = s.startLocked()
		if err == nil {
			return nil
		}
		if !errors.Is(err, errAddrInUse) || attempt+1 >= bindAttempts*4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the port's other holder must let go; nothing to wait on
	}
	return fmt.Errorf("redistest: restart redis-server on %s: %w\noutput:\n%s", s.Addr(), err, s.out.tail(outputTail))
}

// Pause freezes the server with SIGSTOP. It keeps its connections and the
// kernel still accepts new ones, but nothing is answered: clients see
// read timeouts, not connection errors. Pausing a paused or stopped server
// is a no-op. Call Resume (or Kill, Stop, Restart) to end it.
func (s *Server) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.paused {
		return
	}
	if err := s.proc.cmd.Process.Signal(syscall.SIGSTOP); err == nil {
		s.paused = true
	}
}

// Resume continues a paused server with SIGCONT; commands queued while it
// was paused are then answered. Resuming a server that is not paused is a
// no-op.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || !s.paused {
		return
	}
	_ = s.proc.cmd.Process.Signal(syscall.SIGCONT)
	s.paused = false
}

// killLocked kills and reaps the running process, if any. s.mu must be held.
func (s *Server) killLocked() {
	p := s.proc
	if p == nil {
		return
	}
	// SIGKILL also ends a SIGSTOPped process.
	_ = p.cmd.Process.Kill()
	<-p.done
	s.proc, s.paused = nil, false
}

// startLocked runs redis-server with s.args and waits for PING.
// It returns errAddrInUse (wrapped) if the port was taken. s.mu must be held.
func (s *Server) startLocked() error {
	fmt.Fprintf(s.out, "--- redistest: starting %s %s\n", s.bin, strings.Join(s.args, " "))
	mark := s.out.Len()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	cmd.Stdout = s.out
	cmd.Stderr = s.out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-p.done:
			if strings.Contains(s.out.since(mark), "Address already in use") {
				return fmt.Errorf("%w: port %d", errAddrInUse, s.port)
			}
			return fmt.Errorf("redis-server exited before answering PING: %v", p.err)
		default:
		}
		if err := ping(s.Addr()); err == nil {
			s.proc, s.paused = p, false
			return nil
		} else if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("redis-server did not answer PING within %v: %v", startTimeout, err)
		}
		time.Sleep(10 * time.Millisecond) // polling readiness; redis offers no notification
	}
}

// ping sends one RESP PING and expects +PONG, or -NOAUTH from a server
// started with --requirepass: either way it answers.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" && !strings.HasPrefix(line, "-NOAUTH ") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before redis-server binds it; callers retry.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// syncBuffer is a bytes buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu  sync.Mutex // protects buf
	buf []byte
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.buf)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// since returns what was written after offset.
func (b *syncBuffer) since(offset int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf[offset:])
}

// tail returns at most the last n bytes.
func (b *syncBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) <= n {
		return string(b.buf)
	}
	return "...\n" + string(b.buf[len(b.buf)-n:])
}

// arg returns the value following name in the server's arguments, or "".
func (s *Server) arg(name string) string {
	for i := 0; i+1 < len(s.args); i++ {
		if s.args[i] == name {
			return s.args[i+1]
		}
	}
	return ""
}
