package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/matbus/matbus/matsim"
)

// The MAT simulators run in a process of their own, so that what serving
// the status costs (HTTP, TLS, rendering, the garbage collector) is that
// process's CPU time in /proc and nothing else's. The process is the
// harness binary itself, started through a symlink named "matsim" (its
// comm, so CPU rows group it apart) with simHostArg as first argument; the
// harness drives it over a loopback control API.

// simHostArg as os.Args[1] makes the harness binary a simulator host.
const simHostArg = "__matsim-host"

// simulator is what a round does with one MAT simulator.
type simulator interface {
	SetFleet(f *matsim.Fleet) error
	RemoveDevice(matID string) error
	Fleet() *matsim.Fleet
	Requests() int64
	Connections() int64
}

// simHostReady is what a simulator host writes to its ready file.
type simHostReady struct {
	Control string   `json:"control"` // host:port of the control API
	URLs    []string `json:"urls"`    // one base URL per simulator
}

// simCounters are the counters of every simulator of a host, by index.
type simCounters struct {
	Requests    []int64 `json:"requests"`
	NotModified []int64 `json:"not_modified"`
	Conns       []int64 `json:"connections"`
	Bytes       []int64 `json:"bytes_sent"`
	// CPUNanos is the host process's user+system CPU time so far
	// (getrusage RUSAGE_SELF, microsecond resolution; /proc's clock ticks
	// of 10 ms are too coarse for a 30 s window of a few polls).
	CPUNanos int64 `json:"cpu_ns"`
}

// simHost is a running simulator host process.
type simHost struct {
	p       *proc
	control string
	urls    []string
	hc      *http.Client
	sims    []*remoteSim
}

// startSimHost starts a host serving fleets over HTTPS (ETags on unless
// noETag), logging to dir/<name>.log, and waits until it listens.
func startSimHost(ctx context.Context, dir, name string, fleets []*matsim.Fleet, noETag bool) (*simHost, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	link := filepath.Join(dir, "matsim")
	if _, err := os.Lstat(link); err != nil {
		if err := os.Symlink(exe, link); err != nil {
			return nil, fmt.Errorf("simulator host: %w", err)
		}
	}
	fleetFile := filepath.Join(dir, name+"-fleets.json")
	js, err := json.Marshal(fleets)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(fleetFile, js, 0o644); err != nil {
		return nil, err
	}
	ready := filepath.Join(dir, name+"-ready.json")
	_ = os.Remove(ready)
	p, err := startProc(ctx, dir, name, link, simHostArg, fleetFile, ready, strconv.FormatBool(noETag))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(ready)
		var r simHostReady
		if err == nil && json.Unmarshal(b, &r) == nil && r.Control != "" {
			h := &simHost{p: p, control: r.Control, urls: r.URLs, hc: &http.Client{Timeout: 30 * time.Second}}
			for i, fl := range fleets {
				shadow, err := matsim.New(matsim.Options{Fleet: fl}) // never started: the model of what the remote serves
				if err != nil {
					p.Stop()
					return nil, err
				}
				h.sims = append(h.sims, &remoteSim{h: h, i: i, shadow: shadow})
			}
			return h, nil
		}
		if p.Exited() || time.Now().After(deadline) || ctx.Err() != nil {
			p.Stop()
			return nil, fmt.Errorf("simulator host %s did not start: %v\n%s", name, p.waitErr, p.Tail(10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends the host process.
func (h *simHost) Stop() {
	h.hc.CloseIdleConnections()
	h.p.Stop()
}

// simulators returns the host's simulators, in the order of its fleets.
func (h *simHost) simulators() []simulator {
	out := make([]simulator, len(h.sims))
	for i, s := range h.sims {
		out[i] = s
	}
	return out
}

// counters reads every simulator's counters.
func (h *simHost) counters() (simCounters, error) {
	var c simCounters
	resp, err := h.hc.Get("http://" + h.control + "/counters")
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("simulator host: counters: HTTP %d", resp.StatusCode)
	}
	return c, json.NewDecoder(resp.Body).Decode(&c)
}

func (h *simHost) post(path string, q url.Values, body any) error {
	js, err := json.Marshal(body)
	if err != nil {
		return err
	}
	resp, err := h.hc.Post("http://"+h.control+path+"?"+q.Encode(), "application/json", bytes.NewReader(js))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("simulator host %s: HTTP %d: %s", path, resp.StatusCode, msg)
	}
	return nil
}

// remoteSim is simulator i of a host. A shadow matsim.Server (never
// started) applies every change too, so Fleet answers locally with
// matsim's own semantics.
type remoteSim struct {
	h      *simHost
	i      int
	shadow *matsim.Server
}

func (s *remoteSim) SetFleet(f *matsim.Fleet) error {
	if err := s.shadow.SetFleet(f); err != nil {
		return err
	}
	return s.h.post("/fleet", url.Values{"sim": {strconv.Itoa(s.i)}}, f)
}

func (s *remoteSim) RemoveDevice(matID string) error {
	if err := s.shadow.RemoveDevice(matID); err != nil {
		return err
	}
	return s.h.post("/remove", url.Values{"sim": {strconv.Itoa(s.i)}, "mat_id": {matID}}, nil)
}

func (s *remoteSim) Fleet() *matsim.Fleet { return s.shadow.Fleet() }

func (s *remoteSim) Requests() int64 {
	c, err := s.h.counters()
	if err != nil || s.i >= len(c.Requests) {
		return -1
	}
	return c.Requests[s.i]
}

func (s *remoteSim) Connections() int64 {
	c, err := s.h.counters()
	if err != nil || s.i >= len(c.Conns) {
		return -1
	}
	return c.Conns[s.i]
}

// simHostMain runs the simulator host when os.Args[1] is simHostArg
// (arguments: fleets file, ready file, "true" to disable ETags) and
// reports whether it did; the process should then exit with its code.
func simHostMain() (code int, ran bool) {
	if len(os.Args) < 2 || os.Args[1] != simHostArg {
		return 0, false
	}
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "simulator host: want <fleets.json> <ready.json> <no-etag>")
		return 2, true
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	noETag, _ := strconv.ParseBool(os.Args[4])
	if err := runSimHost(ctx, os.Args[2], os.Args[3], noETag); err != nil {
		fmt.Fprintln(os.Stderr, "simulator host:", err)
		return 1, true
	}
	return 0, true
}

func runSimHost(ctx context.Context, fleetFile, readyFile string, noETag bool) error {
	b, err := os.ReadFile(fleetFile)
	if err != nil {
		return err
	}
	var fleets []*matsim.Fleet
	if err := json.Unmarshal(b, &fleets); err != nil {
		return fmt.Errorf("%s: %w", fleetFile, err)
	}
	var sims []*matsim.Server
	defer func() {
		for _, s := range sims {
			_ = s.Close()
		}
	}()
	ready := simHostReady{}
	for _, fl := range fleets {
		s, err := matsim.New(matsim.Options{Fleet: fl, TLS: true, DisableETag: noETag})
		if err != nil {
			return err
		}
		sims = append(sims, s)
		u, err := s.Start(ctx, "127.0.0.1:0")
		if err != nil {
			return err
		}
		ready.URLs = append(ready.URLs, u)
	}
	sim := func(w http.ResponseWriter, r *http.Request) *matsim.Server {
		i, err := strconv.Atoi(r.URL.Query().Get("sim"))
		if err != nil || i < 0 || i >= len(sims) {
			http.Error(w, "bad sim", http.StatusBadRequest)
			return nil
		}
		return sims[i]
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /fleet", func(w http.ResponseWriter, r *http.Request) {
		s := sim(w, r)
		if s == nil {
			return
		}
		var f matsim.Fleet
		if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := s.SetFleet(&f); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /remove", func(w http.ResponseWriter, r *http.Request) {
		s := sim(w, r)
		if s == nil {
			return
		}
		if err := s.RemoveDevice(r.URL.Query().Get("mat_id")); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /counters", func(w http.ResponseWriter, _ *http.Request) {
		var c simCounters
		for _, s := range sims {
			c.Requests = append(c.Requests, s.Requests())
			c.NotModified = append(c.NotModified, s.NotModified())
			c.Conns = append(c.Conns, s.Connections())
			c.Bytes = append(c.Bytes, s.BytesSent())
		}
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
			c.CPUNanos = ru.Utime.Nano() + ru.Stime.Nano()
		}
		_ = json.NewEncoder(w).Encode(c)
	})
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	ready.Control = ln.Addr().String()
	js, err := json.Marshal(ready)
	if err != nil {
		return err
	}
	if err := os.WriteFile(readyFile+".tmp", js, 0o644); err != nil {
		return err
	}
	if err := os.Rename(readyFile+".tmp", readyFile); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-done:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
