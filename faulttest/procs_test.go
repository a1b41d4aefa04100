package faulttest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// lineLog keeps a process's output: every line goes to a file and to
// watchers waiting for a substring.
type lineLog struct {
	mu       sync.Mutex
	file     *os.File
	partial  []byte
	lines    []string
	watchers []*watcher
}

type watcher struct {
	substrs []string
	ch      chan string
}

func newLineLog(path string) (*lineLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &lineLog{file: f}, nil
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.file.Write(p)
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		l.lines = append(l.lines, line)
		if os.Getenv("MATBUS_TEST_LOG") != "" {
			fmt.Fprintln(os.Stderr, line)
		}
		kept := l.watchers[:0]
		for _, w := range l.watchers {
			if containsAll(line, w.substrs) {
				w.ch <- line // buffered, one slot
				continue
			}
			kept = append(kept, w)
		}
		l.watchers = kept
	}
	return len(p), nil
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Watch returns a channel that receives the first line written from now on
// that contains every one of substrs.
func (l *lineLog) Watch(substrs ...string) <-chan string {
	ch := make(chan string, 1)
	l.mu.Lock()
	l.watchers = append(l.watchers, &watcher{substrs: substrs, ch: ch})
	l.mu.Unlock()
	return ch
}

// Count returns how many lines so far contain every one of substrs.
func (l *lineLog) Count(substrs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if containsAll(line, substrs) {
			n++
		}
	}
	return n
}

// Tail returns the last n lines.
func (l *lineLog) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.lines
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (l *lineLog) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.file.Close()
}

// proc is one OS process the test started (matbus or nats-server).
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	log    *lineLog
	health string // host:port of /readyz and /metrics ("" when none)
	done   chan struct{}
	waitMu sync.Mutex
	state  *os.ProcessState
	signal bool // the test signalled it: an exit is expected
}

// startProc starts bin with args; output goes to dir/<name>.log.
func startProc(t *testing.T, dir, name, bin string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, dir, name, bin, nil, args...)
}

// startProcEnv is startProc with env ("NAME=value") added to the
// process's environment.
func startProcEnv(t *testing.T, dir, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	l, err := newLineLog(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = l, l
	cmd.Env = append(append(os.Environ(), "GOTRACEBACK=all"), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{t: t, name: name, cmd: cmd, log: l, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		p.waitMu.Lock()
		p.state = cmd.ProcessState
		p.waitMu.Unlock()
		l.Close()
		close(p.done)
	}()
	return p
}

// Exited reports whether the process has ended.
func (p *proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL and waits for the process to end.
func (p *proc) Kill() {
	p.signal = true
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Term sends SIGTERM and waits up to limit for the exit; it returns how
// long the exit took and the exit status (-1: killed after limit).
func (p *proc) Term(limit time.Duration) (time.Duration, int) {
	p.signal = true
	start := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(limit):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		return time.Since(start), -1
	}
	return time.Since(start), p.state.ExitCode()
}

// stop ends the process at the end of a test and reports crashes: an exit
// the test did not cause, a panic or a data race in the output.
func (p *proc) stop() {
	if !p.Exited() {
		if p.signal {
			p.Kill()
		} else if _, code := p.Term(15 * time.Second); code != 0 {
			p.t.Errorf("%s: exit status %d after SIGTERM", p.name, code)
		}
	} else if !p.signal {
		p.t.Errorf("%s exited on its own: %v", p.name, p.state)
	}
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if n := p.log.Count(bad); n > 0 {
			p.t.Errorf("%s: %q in its output (%d times)", p.name, bad, n)
		}
	}
	if p.t.Failed() {
		p.t.Logf("---- %s (last 60 lines) ----\n%s", p.name, p.log.Tail(60))
	}
}

// get fetches path from the process's health address.
func (p *proc) get(path string) (int, string, error) {
	if p.health == "" {
		return 0, "", fmt.Errorf("%s has no health address", p.name)
	}
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.health + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	c.CloseIdleConnections()
	return resp.StatusCode, string(b), err
}

// Ready reports whether /readyz answers 200.
func (p *proc) Ready() bool {
	code, _, err := p.get("/readyz")
	return err == nil && code == http.StatusOK
}

// Metrics returns the process's Prometheus metrics without labels, by name.
func (p *proc) Metrics() (map[string]float64, error) {
	code, body, err := p.get("/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s /metrics: %d", p.name, code)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out, nil
}

// natsProc is a nats-server process with JetStream and a file store. It
// keeps its port and store folder across restarts.
type natsProc struct {
	t     *testing.T
	dir   string
	store string
	port  int
	n     int
	p     *proc
	// server is the server name (default "faulttest"); extra are more
	// command-line arguments (a cluster node's routes); monitor is the
	// HTTP monitoring port (0: none).
	server  string
	extra   []string
	monitor int
	// auth is the server's configuration file and environment, and how
	// the test connects (zero: no file, no authentication).
	auth natsAuth
}

// natsAuth is a nats-server configuration file (its flags on the command
// line override its listen address, store and name), the environment it
// reads (passwords), and the connect options of the test's own connection.
type natsAuth struct {
	conf string
	env  []string
	opts []nats.Option
}

func startNATS(t *testing.T, dir string, auth natsAuth) *natsProc {
	t.Helper()
	n := &natsProc{t: t, dir: dir, store: filepath.Join(dir, "jetstream"), port: freePort(t), auth: auth}
	n.Start()
	return n
}

// URL is the client URL.
func (n *natsProc) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

// Start starts the server (again) and waits until JetStream answers.
func (n *natsProc) Start() {
	n.t.Helper()
	n.launch()
	n.waitJetStream(20 * time.Second)
}

// launch starts the process without waiting.
func (n *natsProc) launch() {
	n.t.Helper()
	n.n++
	name, log := n.server, "nats-server"
	if name == "" {
		name = "faulttest"
	} else {
		log = "nats-" + name
	}
	args := []string{"-js", "-sd", n.store, "-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "--server_name", name}
	if n.auth.conf != "" {
		if n.monitor == 0 {
			n.monitor = freePort(n.t) // not the file's port: tests run side by side
		}
		args = append([]string{"-c", n.auth.conf}, args...)
	}
	if n.monitor != 0 {
		args = append(args, "-m", strconv.Itoa(n.monitor))
	}
	n.p = startProcEnv(n.t, n.dir, fmt.Sprintf("%s-%d", log, n.n), natsBin, n.auth.env, append(args, n.extra...)...)
}

// waitJetStream waits up to timeout until the server answers JetStream
// requests (in a cluster: once it knows the meta leader).
func (n *natsProc) waitJetStream(timeout time.Duration) {
	n.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		nc, err := nats.Connect(n.URL(), append([]nats.Option{nats.Timeout(time.Second)}, n.auth.opts...)...)
		if err == nil {
			js, jerr := jetstream.New(nc)
			if jerr == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, jerr = js.AccountInfo(ctx)
				cancel()
			}
			nc.Close()
			if jerr == nil {
				return
			}
			err = jerr
		}
		if time.Now().After(deadline) || n.p.Exited() {
			n.t.Fatalf("nats-server not ready on %s: %v\n%s", n.URL(), err, n.p.log.Tail(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends the server: SIGTERM (clean shutdown, store flushed) or SIGKILL.
func (n *natsProc) Stop(kill bool) {
	if kill {
		n.p.Kill()
		return
	}
	if _, code := n.p.Term(20 * time.Second); code != 0 {
		n.t.Logf("nats-server exit status %d after SIGTERM", code)
	}
}

// WipeStore removes the JetStream store (the server must be stopped): the
// next Start has no streams, consumers or de-duplication state.
func (n *natsProc) WipeStore() {
	if err := os.RemoveAll(n.store); err != nil {
		n.t.Fatal(err)
	}
}

func (n *natsProc) stop() {
	if !n.p.Exited() {
		n.p.signal = true
		n.Stop(false)
	}
}

// firstToLog returns a channel that receives the first of procs to log a
// line holding every one of substrs, and a func that ends the watches (call
// it once the answer is in, or when giving up; later calls do nothing).
func firstToLog(procs []*proc, substrs ...string) (<-chan *proc, func()) {
	first := make(chan *proc, len(procs))
	stop := make(chan struct{})
	for _, p := range procs {
		ch := p.log.Watch(substrs...)
		go func() {
			select {
			case <-ch:
				first <- p
			case <-stop:
			}
		}()
	}
	var once sync.Once
	return first, func() { once.Do(func() { close(stop) }) }
}
