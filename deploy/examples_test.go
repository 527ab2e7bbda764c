package deploy

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An example is one shell block of a Markdown file, and what its
// annotation says about it. Annotations are HTML comments on the lines
// just before the block (blank lines between are allowed), one directive
// each:
//
//	<!-- example: run -->               run this indented block (a fenced sh block is run unless skipped)
//	<!-- example: skip REASON -->       not run; the reason is printed
//	<!-- example: serve ADDR CMD -->    CMD runs in the background before the block, which starts once ADDR accepts
//	<!-- example: expect TEXT -->       the block's output holds TEXT
//	<!-- example: file NAME -->         (on a yaml block) written as NAME for the blocks after it
//
// In a block, a line that starts `go run ./cmd/coordd` (and is not
// --check-config or --version) is a server: it runs in the background and
// the next line waits until its --listen address (127.0.0.1:50051 when
// none) accepts, as a reader would open a second terminal.
type example struct {
	file   string // relative to the repository root
	line   int    // of the opening fence or first indented line
	body   string
	trans  bool // an indented transcript: `$ command` lines, each followed by what it prints
	skip   string
	serve  []string // "ADDR CMD"
	expect []string
	asFile string // a yaml block written as this file
}

// shellStart names what an unannotated indented block may not start with:
// such a block is a command a reader would run, so it is run or skipped
// with a reason, never passed over in silence.
var shellStart = regexp.MustCompile(`^(go|make|curl|grpcurl|npm|npx|node|python3|docker|mdn-mcp|ghz|sudo) |^[A-Z_]+=\S+ `)

func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	for _, p := range []string{"docs/*.md", "clients/*/README.md"} {
		m, err := filepath.Glob(filepath.Join("..", p))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			files = append(files, strings.TrimPrefix(f, "../"))
		}
	}
	return files
}

var annotation = regexp.MustCompile(`^<!-- example: (run|skip|serve|expect|file) ?(.*?) -->$`)

// parseExamples returns the shell examples of one Markdown file.
func parseExamples(t *testing.T, file, text string) []example {
	t.Helper()
	var out []example
	var pending example
	annotated := false
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := annotation.FindStringSubmatch(l); m != nil {
			annotated = true
			switch m[1] {
			case "run":
			case "skip":
				pending.skip = m[2]
			case "serve":
				pending.serve = append(pending.serve, m[2])
			case "expect":
				pending.expect = append(pending.expect, m[2])
			case "file":
				pending.asFile = m[2]
			}
			continue
		}
		if strings.HasPrefix(l, "<!-- example") {
			t.Errorf("%s:%d: annotation %q not understood (run, skip, serve, expect or file)", file, i+1, l)
			continue
		}
		if strings.TrimSpace(l) == "" {
			continue
		}
		if lang, ok := strings.CutPrefix(l, "```"); ok {
			start := i + 1
			var body []string
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				body = append(body, lines[i])
			}
			ex := pending
			ex.file, ex.line, ex.body = file, start, strings.Join(body, "\n")+"\n"
			switch {
			case lang == "sh" || lang == "bash":
				if ex.asFile != "" {
					t.Errorf("%s:%d: `file` annotates a yaml block, not a shell one", file, start)
				}
				out = append(out, ex)
			case ex.asFile != "" && lang == "yaml":
				out = append(out, ex)
			case annotated:
				t.Errorf("%s:%d: an example annotation on a ```%s block", file, start, lang)
			}
			pending, annotated = example{}, false
			continue
		}
		if strings.HasPrefix(l, "    ") && (i == 0 || strings.TrimSpace(lines[i-1]) == "" || annotation.MatchString(lines[i-1])) {
			start := i + 1
			var body []string
			for ; i < len(lines) && (strings.HasPrefix(lines[i], "    ") || strings.TrimSpace(lines[i]) == ""); i++ {
				body = append(body, strings.TrimPrefix(lines[i], "    "))
			}
			i--
			for len(body) > 0 && strings.TrimSpace(body[len(body)-1]) == "" {
				body = body[:len(body)-1]
			}
			ex := pending
			ex.file, ex.line, ex.body = file, start, strings.Join(body, "\n")+"\n"
			ex.trans = strings.HasPrefix(body[0], "$ ")
			switch {
			case ex.trans || annotated:
				out = append(out, ex)
			case shellStart.MatchString(body[0]):
				t.Errorf("%s:%d: %q looks like a command to run: say so (<!-- example: run -->, or a ```sh block) or say why not (<!-- example: skip REASON -->)", file, start, body[0])
			}
			pending, annotated = example{}, false
			continue
		}
		if annotated {
			t.Errorf("%s:%d: an example annotation followed by prose, not a block", file, i+1)
		}
		pending, annotated = example{}, false
	}
	return out
}

// TestDocExamples runs every shell example of README.md, docs/*.md and the
// clients' READMEs as a reader would, each file's in order in one copy of
// the repository, in a network namespace of its own (so the fixed ports
// the examples name are free, and nothing reaches the internet). There,
// https://developer.mozilla.org and https://api.github.com are a local
// fake world behind HTTPS_PROXY, its CA in SSL_CERT_FILE: the examples run
// byte for byte as the docs show them. A block fails when a command fails
// (bash -e), when its output lacks what an `expect` names, and, for a
// transcript, when a command that the docs show failing succeeds or one
// shown succeeding fails, or when its output lacks a field, an enum value
// or an error's code and message the docs show (numbers and durations are
// illustrative).
func TestDocExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("runs coordd, grpcurl, curl and Python in a network namespace; make test runs it")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var all []example
	for _, f := range markdownFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, parseExamples(t, f, string(b))...)
	}
	if t.Failed() {
		return
	}
	grpcurl := filepath.Join(root, ".tools", "bin", "grpcurl")
	if _, err := os.Stat(grpcurl); err != nil {
		t.Fatalf("the examples need grpcurl at %s: run make deps (it is installed with go install)", grpcurl)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatal("the examples run in a network namespace of their own: unshare (util-linux) is required")
	}
	nsArgs := []string{"--net"}
	if os.Getuid() != 0 {
		nsArgs = append(nsArgs, "--map-root-user")
	}
	if out, err := exec.Command(unshare, append(nsArgs, "true")...).CombinedOutput(); err != nil {
		t.Fatalf("the examples run in a network namespace of their own, and `unshare %s true` fails: %v: %s", strings.Join(nsArgs, " "), err, out)
	}
	work := copyTree(t, root)
	goEnv := map[string]string{}
	for _, k := range []string{"GOPATH", "GOMODCACHE", "GOCACHE", "GOROOT"} {
		out, err := exec.Command("go", "env", k).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", k, err)
		}
		goEnv[k] = strings.TrimSpace(string(out))
	}
	// Inside the namespace the module proxy is the module cache itself
	// (GOPROXY=file://…), so what the examples build must be there first.
	if out, err := exec.Command("go", "-C", work, "mod", "download").CombinedOutput(); err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	byFile := map[string][]example{}
	var order []string
	for _, ex := range all {
		if _, ok := byFile[ex.file]; !ok {
			order = append(order, ex.file)
		}
		byFile[ex.file] = append(byFile[ex.file], ex)
	}
	ran := 0
	for _, file := range order {
		t.Run(file, func(t *testing.T) {
			ran += runFile(t, root, work, nsArgs, goEnv, byFile[file])
		})
	}
	if ran == 0 {
		t.Fatal("no example ran")
	}
}

// A step is one thing the driver runs in the namespace: a shell block, or
// one command of a transcript.
type step struct {
	ex     *example
	script string
	want   string // a transcript command's shown output
	pre    string // driver lines before it (a transcript's servers)
	post   string // and after it
}

func runFile(t *testing.T, root, work string, nsArgs []string, goEnv map[string]string, exs []example) int {
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	world := filepath.Join(dir, "world")
	for _, d := range []string{home, world, filepath.Join(home, ".config")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The tokens a reader keeps in files; the fake GitHub answers only a
	// tenant's (team-a's credential is the one a team-a call must send).
	for name, tok := range map[string]string{"github-token": "ghp_upstreamDocExample0123456789", "team-a-github-token": "ghp_teamADocExample0123456789abc"} {
		if err := os.WriteFile(filepath.Join(home, ".config", name), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var steps []step
	for i := range exs {
		ex := &exs[i]
		switch {
		case ex.skip != "":
			t.Logf("%s:%d: not run: %s", ex.file, ex.line, ex.skip)
		case ex.asFile != "":
			if err := os.WriteFile(filepath.Join(work, ex.asFile), []byte(ex.body), 0o644); err != nil {
				t.Fatal(err)
			}
		case ex.trans:
			// A transcript is one session: its servers run from its first
			// command to its last.
			cmds := transcriptCommands(ex.body)
			for j, c := range cmds {
				st := step{ex: ex, script: blockScript(nil, c.cmd), want: c.out}
				if j == 0 {
					for _, sv := range ex.serve {
						st.pre += fmt.Sprintf("cd %q && { serve %s; } >>%q/serve.out 2>&1 || { cat %q/serve.out; exit 96; }\n", work, sv, dir, dir)
					}
				}
				if j == len(cmds)-1 {
					st.post = "stopall; pgids=()\n"
				}
				steps = append(steps, st)
			}
		default:
			steps = append(steps, step{ex: ex, script: blockScript(ex.serve, ex.body)})
		}
	}
	if len(steps) == 0 {
		return 0
	}
	var drv strings.Builder
	fmt.Fprintf(&drv, "set -u\nip link set lo up\nsource %q\n", filepath.Join(dir, "lib.sh"))
	fmt.Fprintf(&drv, "DOCS_EXAMPLES_WORLD=%q %q -test.run='^$' >%q/log 2>&1 &\n", world, os.Args[0], world)
	fmt.Fprintf(&drv, "for _ in $(seq 600); do [ -e %q/ready ] && break; sleep 0.1; done\n", world)
	fmt.Fprintf(&drv, "[ -e %q/ready ] || { echo 'the fake world did not start:'; cat %q/log; exit 97; }\n", world, world)
	for i, s := range steps {
		sf := filepath.Join(dir, fmt.Sprintf("step%d.sh", i))
		if err := os.WriteFile(sf, []byte(s.script), 0o644); err != nil {
			t.Fatal(err)
		}
		drv.WriteString(s.pre)
		fmt.Fprintf(&drv, "(cd %q && bash %q) >%q/step%d.out 2>&1 </dev/null; echo $? >%q/step%d.rc\n", work, sf, dir, i, dir, i)
		drv.WriteString(s.post)
	}
	drvFile := filepath.Join(dir, "driver.sh")
	if err := os.WriteFile(drvFile, []byte(drv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "lib.sh")
	if err := os.WriteFile(lib, []byte(libScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", append(nsArgs, "bash", drvFile)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	env := []string{
		"PATH=" + filepath.Join(root, ".tools", "bin") + ":" + filepath.Join(goEnv["GOROOT"], "bin") + ":" + os.Getenv("PATH"),
		"HOME=" + home, "LANG=C.UTF-8", "TERM=dumb",
		"DOCS_EXAMPLES_LIB=" + lib,
		"HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128",
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
		"SSL_CERT_FILE=" + filepath.Join(world, "ca.pem"),
		"GOPROXY=file://" + filepath.Join(goEnv["GOMODCACHE"], "cache", "download"), "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly", "GONOSUMDB=*", "GOSUMDB=off",
	}
	for k, v := range goEnv {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	done := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	out, err := cmd.CombinedOutput()
	close(done)
	if err != nil {
		t.Fatalf("driver: %v\n%s", err, out)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything a step left behind
	ran := 0
	for i, s := range steps {
		rcb, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("step%d.rc", i)))
		if err != nil {
			t.Fatalf("step %d left no status: %v\ndriver: %s", i, err, out)
		}
		got, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("step%d.out", i)))
		rc := strings.TrimSpace(string(rcb))
		where := fmt.Sprintf("%s:%d", s.ex.file, s.ex.line)
		ran++
		if s.ex.trans {
			for _, p := range checkTranscript(s.want, string(got), rc == "0") {
				t.Errorf("%s: %s\nthe docs show:\n%s\nit printed (exit %s):\n%s", where, p, s.want, rc, got)
			}
			continue
		}
		if rc != "0" {
			t.Errorf("%s: the example fails as written (exit %s):\n%s\nit printed:\n%s", where, rc, s.ex.body, got)
			continue
		}
		for _, e := range s.ex.expect {
			if !strings.Contains(string(got), e) {
				t.Errorf("%s: the output lacks %q:\n%s", where, e, got)
			}
		}
	}
	return ran
}

// libScript is sourced by every step: serve starts a command in the
// background in a process group of its own, then waits until ADDR accepts
// a connection (a minute and a half at most: a first `go run` compiles),
// failing at once if the command exits first; every one is killed (its
// whole process group: `go run`'s child too) when the step ends, and the
// step waits until the group is gone, so its ports are free for the next.
const libScript = `
pgids=()
stopall() {
	set +e
	for p in "${pgids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
	for p in "${pgids[@]}"; do wait "$p" 2>/dev/null; while kill -0 -- "-$p" 2>/dev/null; do sleep 0.05; done; done
}
trap stopall EXIT
serve() {
	local addr=$1; shift
	setsid "$@" >>server.log 2>&1 &
	local pid=$!
	pgids+=("$pid")
	for _ in $(seq 900); do
		(exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null && return 0
		kill -0 "$pid" 2>/dev/null || { echo "serve: $* exited before $addr accepted:"; tail -n 30 server.log; return 1; }
		sleep 0.1
	done
	echo "serve: $addr did not accept within 90s: $*"; tail -n 30 server.log; return 1
}
`

var coorddServer = regexp.MustCompile(`^go run \./cmd/coordd\b`)
var listenFlag = regexp.MustCompile(`--listen[ =](\S+)`)

// blockScript is the shell script of one step: the lib, the block's
// servers, then its body with each coordd it starts sent to the background.
func blockScript(serve []string, body string) string {
	var b strings.Builder
	b.WriteString("source \"$DOCS_EXAMPLES_LIB\"\nset -e\n")
	for _, s := range serve {
		fmt.Fprintf(&b, "serve %s\n", s)
	}
	for _, l := range strings.Split(body, "\n") {
		if coorddServer.MatchString(l) && !strings.Contains(l, "--check-config") && !strings.Contains(l, "--version") {
			addr := "127.0.0.1:50051"
			if m := listenFlag.FindStringSubmatch(l); m != nil {
				addr = m[1]
			}
			fmt.Fprintf(&b, "serve %s %s\n", addr, l)
			continue
		}
		b.WriteString(l + "\n")
	}
	return b.String()
}

type transcriptCmd struct{ cmd, out string }

// transcriptCommands splits a transcript into its commands (a `$ ` line
// and the lines it continues with a trailing backslash) and what each
// prints.
func transcriptCommands(body string) []transcriptCmd {
	var out []transcriptCmd
	lines := strings.Split(body, "\n")
	for i := 0; i < len(lines); i++ {
		c, ok := strings.CutPrefix(lines[i], "$ ")
		if !ok {
			continue
		}
		cmd := c
		for strings.HasSuffix(strings.TrimSpace(cmd), "\\") && i+1 < len(lines) {
			i++
			cmd += "\n" + lines[i]
		}
		var shown []string
		for i+1 < len(lines) && !strings.HasPrefix(lines[i+1], "$ ") {
			i++
			shown = append(shown, lines[i])
		}
		// A trailing `# remark` the docs add is bash's comment: left as it is.
		out = append(out, transcriptCmd{cmd: cmd + "\n", out: strings.TrimSpace(strings.Join(shown, "\n"))})
	}
	return out
}

var (
	shownField = regexp.MustCompile(`"(\w+)": ("[^"]*"|[\w.]+)`)
	enumValue  = regexp.MustCompile(`^"[A-Z][A-Z0-9_]+"$`)
)

// checkTranscript compares what a command printed with what the docs show.
func checkTranscript(shown, got string, ok bool) []string {
	var problems []string
	if strings.HasPrefix(shown, "ERROR:") {
		if ok {
			return []string{"the docs show it failing, and it succeeded"}
		}
		for _, l := range strings.Split(shown, "\n")[1:] {
			if l = strings.TrimSpace(l); l != "" && !strings.Contains(got, l) {
				problems = append(problems, fmt.Sprintf("the error lacks %q", l))
			}
		}
		return problems
	}
	if !ok {
		return []string{"the docs show it succeeding, and it failed"}
	}
	flat := strings.Join(strings.Fields(got), " ")
	fields := shownField.FindAllStringSubmatch(shown, -1)
	if len(fields) == 0 {
		gotLines := strings.Split(strings.TrimSpace(got), "\n")
		for _, l := range strings.Split(shown, "\n") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(gotLines, l) {
				problems = append(problems, fmt.Sprintf("no line %q", l))
			}
		}
	}
	for _, f := range fields {
		name, val := f[1], f[2]
		switch {
		case !strings.Contains(got, `"`+name+`":`):
			problems = append(problems, fmt.Sprintf("no field %q", name))
		case enumValue.MatchString(val) && !strings.Contains(flat, `"`+name+`": `+val):
			problems = append(problems, fmt.Sprintf("%q is not %s", name, val))
		}
	}
	return problems
}

// copyTree copies the repository's files (tracked, and new ones not
// ignored) into a temporary directory, so that what the examples write
// (coordd.yaml, a venv, a build) stays out of the tree.
func copyTree(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "coordd")
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, f)
		fi, err := os.Lstat(src)
		if err != nil {
			if os.IsNotExist(err) { // deleted, not yet committed
				continue
			}
			t.Fatal(err)
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		d := filepath.Join(dst, f)
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(d, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestMain serves the fake world when the driver starts this binary with
// DOCS_EXAMPLES_WORLD set, inside the examples' namespace.
func TestMain(m *testing.M) {
	if dir := os.Getenv("DOCS_EXAMPLES_WORLD"); dir != "" {
		if err := serveWorld(dir); err != nil {
			fmt.Fprintln(os.Stderr, "world:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// worldHosts are the sites the examples name, served by the fake world.
var worldHosts = []string{"developer.mozilla.org", "api.github.com"}

// serveWorld is an HTTP proxy on 127.0.0.1:3128 that answers CONNECT to
// the worldHosts itself, with TLS under a CA written to dir/ca.pem: an
// MDN that serves any /index.json with an ETag (and 304 to it), and a
// GitHub whose issues answer a team-a token only.
//
// Its CA is made here, not with internal/testing/testpki, whose functions take a
// testing.TB: this runs from TestMain, in a process of its own.
func serveWorld(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "coordd docs' world CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: worldHosts[0]}, DNSNames: worldHosts,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return err
	}
	tlsConf := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}, NextProtos: []string{"http/1.1"}}
	sites := &http.Server{Handler: http.HandlerFunc(worldSite), ReadHeaderTimeout: 10 * time.Second}
	conns := make(chan net.Conn)
	go func() { _ = sites.Serve(&chanListener{conns: conns}) }()
	ln, err := net.Listen("tcp", "127.0.0.1:3128")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644); err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			br := bufio.NewReader(c)
			req, err := http.ReadRequest(br)
			host, _, _ := net.SplitHostPort(func() string {
				if req == nil {
					return ""
				}
				return req.Host
			}())
			if err != nil || req.Method != http.MethodConnect || !slices.Contains(worldHosts, host) {
				fmt.Fprintf(os.Stderr, "world: refused %v %v\n", req, err)
				_, _ = io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
				_ = c.Close()
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
			conns <- tls.Server(&bufferedConn{Conn: c, r: br}, tlsConf)
		}()
	}
}

func worldSite(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(os.Stderr, "world: %s %s%s\n", r.Method, r.Host, r.URL)
	switch {
	case r.Host == "developer.mozilla.org" && strings.HasSuffix(r.URL.Path, "/index.json"):
		body, _ := json.Marshal(map[string]any{"doc": map[string]any{"isMarkdown": true, "title": strings.TrimSuffix(r.URL.Path, "/index.json"), "body": strings.Repeat("x", 4096)}})
		etag := fmt.Sprintf(`"%x"`, len(r.URL.Path))
		w.Header().Set("ETag", etag)
		w.Header().Set("Cache-Control", "max-age=600")
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	case r.Host == "api.github.com" && strings.HasPrefix(r.URL.Path, "/repos/"):
		if r.Header.Get("Authorization") != "Bearer ghp_teamADocExample0123456789abc" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"message":"Bad credentials"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("X-RateLimit-Limit", "5000")
		w.Header().Set("X-RateLimit-Remaining", "4999")
		w.Header().Set("X-RateLimit-Reset", fmt.Sprint(time.Now().Add(time.Hour).Unix()))
		_, _ = io.WriteString(w, `[{"number":1,"title":"an issue"}]`)
	default:
		http.NotFound(w, r)
	}
}

// chanListener is a net.Listener fed the proxied connections.
type chanListener struct{ conns chan net.Conn }

func (l *chanListener) Accept() (net.Conn, error) { return <-l.conns, nil }
func (l *chanListener) Close() error              { return nil }
func (l *chanListener) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 3128} }

// bufferedConn reads first what the CONNECT's reader already buffered.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if c.r.Buffered() > 0 {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}
