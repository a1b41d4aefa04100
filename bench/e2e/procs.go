package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/kubelocal"

	"github.com/matbus/matbus/bench/internal/load"
)

// stopGrace is how long a process may take to exit after SIGTERM before
// it is killed.
const stopGrace = 15 * time.Second

// proc is an OS process the harness started. Its output goes to a log
// file. It ends when Stop is called or when the context it was started
// with ends (SIGTERM, then SIGKILL after stopGrace).
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	health  string // host:port of /readyz ("" when none)
	pprof   string // host:port serving /debug/pprof/ ("" when none)
	cancel  context.CancelFunc
	done    chan struct{}
	waitErr error
}

// startProc starts bin with args in its own process group; output goes
// to dir/<name>.log.
func startProc(ctx context.Context, dir, name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(pctx, bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	if err := cmd.Start(); err != nil {
		cancel()
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, cancel: cancel, done: make(chan struct{})}
	go func() { // ends when the process does; pctx ending makes it end
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Stop ends the process (SIGTERM, SIGKILL after stopGrace) and waits for
// it. It is safe to call more than once.
func (p *proc) Stop() {
	p.cancel()
	<-p.done
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

// Tail returns the last n lines of the process's log.
func (p *proc) Tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CountLines returns how many lines of the log contain substr.
func (p *proc) CountLines(substr string) int {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte(substr)) // substr occurs at most once per line in practice
}

// Mem reads VmRSS and VmHWM (bytes) of the running process.
func (p *proc) Mem() (rss, hwm int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	return memStatus(string(b))
}

// roleMatbus is the program under which the CPU rows count the discovery
// and worker processes the harness started, whatever the file name of
// the --matbus binary (the kernel's comm is that file name: --matbus
// /tmp/matbus-now runs as "matbus-now").
const roleMatbus = "matbus"

// roles names the running processes the harness started by their role in
// the run (pid → role), for the CPU rows. The zero value is empty.
type roles struct {
	mu    sync.Mutex
	byPID map[int]string
}

func (r *roles) set(pid int, role string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byPID == nil {
		r.byPID = map[int]string{}
	}
	r.byPID[pid] = role
}

func (r *roles) forget(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byPID, pid)
}

// name is pid's role, "" for a process with none.
func (r *roles) name(pid int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byPID[pid]
}

// startMatbus starts a matbus process (`matbus worker`, `matbus
// discovery`) of the --matbus binary and records its role until it has
// exited (its pid may then be reused).
func (b *bench) startMatbus(ctx context.Context, dir, name string, args ...string) (*proc, error) {
	p, err := startProc(ctx, dir, name, b.cfg.Matbus, args...)
	if err != nil {
		return nil, err
	}
	pid := p.cmd.Process.Pid
	b.roles.set(pid, roleMatbus)
	go func() {
		<-p.done
		b.roles.forget(pid)
	}()
	return p, nil
}

// sampleCPU reads the CPU counters with the processes named by role.
func (b *bench) sampleCPU() (load.CPUSample, error) {
	return load.SampleCPUNamed(b.roles.name)
}

// WaitReady polls /readyz every 100 ms until it answers 200, the process
// exits, or timeout passes.
func (p *proc) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.health+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.Exited() {
			return fmt.Errorf("%s exited: %v\n%s", p.name, p.waitErr, p.Tail(20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v:\n%s", p.name, timeout, p.Tail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freeAddr returns "127.0.0.1:<port>" with a port that was free a moment ago.
func freeAddr() (string, error) {
	port, err := kubelocal.FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// startNATS starts a nats-server process with JetStream and a file store
// in dir and waits until JetStream answers. It returns the process and
// the client URL. With profiling, the server also serves /debug/pprof/ on
// a port of its own (its --profile), kept in the process's pprof field.
func startNATS(ctx context.Context, bin, dir, name string, profiling bool) (*proc, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	host, port, _ := strings.Cut(addr, ":")
	args := []string{"-js", "-sd", filepath.Join(dir, name+"-store"), "-a", host, "-p", port, "--server_name", name}
	var profAddr string
	if profiling {
		if profAddr, err = freeAddr(); err != nil {
			return nil, "", err
		}
		_, profPort, _ := strings.Cut(profAddr, ":")
		args = append(args, "--profile", profPort)
	}
	p, err := startProc(ctx, dir, name, bin, args...)
	if err != nil {
		return nil, "", err
	}
	p.pprof = profAddr
	url := "nats://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := jetStreamUp(ctx, url)
		if err == nil {
			return p, url, nil
		}
		if p.Exited() || time.Now().After(deadline) || ctx.Err() != nil {
			p.Stop()
			return nil, "", errors.Join(fmt.Errorf("nats-server not ready on %s: %w", url, err), errors.New(p.Tail(20)))
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func jetStreamUp(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

func mkdir(dir string) error { return os.MkdirAll(dir, 0o755) }
