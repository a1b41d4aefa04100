package health

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Serve serves /healthz, /readyz and /metrics (Prometheus) on addr
// until ctx ends. /healthz is liveness only: 200 while the process serves
// HTTP. /readyz is 200 "ok" when ready returns nil, else 503 with
// "not ready: <reason>" (one line). With profiling, Go's runtime profiles
// are served under /debug/pprof/ too (net/http/pprof: CPU profile for
// ?seconds=N, heap, goroutine, ...), but not /debug/pprof/cmdline: the
// command line may hold a password (--nats-url). An empty addr serves
// nothing.
func Serve(ctx context.Context, addr string, ready func() error, reg *prometheus.Registry, profiling bool, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+strings.ReplaceAll(err.Error(), "\n", " "), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if reg != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	}
	paths := "/healthz /readyz /metrics"
	if profiling {
		// pprof.Index answers 404 for /debug/pprof/cmdline, which is not
		// registered: the command line may hold a password.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		paths += " /debug/pprof/"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("health listener on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health server stopped", "error", err)
		}
	}()
	log.Info("health endpoints", "addr", l.Addr().String(), "paths", paths)
	return nil
}

// Options are worker's and discovery's flags of the listener of /healthz,
// /readyz, /metrics and, with Profiling, /debug/pprof/.
type Options struct {
	// Addr is the listener's address (--health-addr); empty: none.
	Addr string
	// Profiling serves Go's runtime profiles too (--profiling).
	Profiling bool
}

// AddFlags registers --health-addr and --profiling on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Addr, "health-addr", ":8080", "address of /healthz, /readyz and /metrics; empty disables")
	fs.BoolVar(&o.Profiling, "profiling", false, "also serve Go's runtime profiles under /debug/pprof/ on --health-addr (CPU: /debug/pprof/profile?seconds=N; heap, goroutine); for diagnosis, not for production exposure")
}

// Validate refuses --profiling without a listener.
func (o *Options) Validate() error {
	if o.Profiling && o.Addr == "" {
		return errors.New("--profiling serves on --health-addr, which is empty")
	}
	return nil
}

// Start runs the health listener of a process of component ("worker",
// "discovery") until ctx ends: matbus_ready{component} on reg, Serve on
// o.Addr (empty: no listener), and a warning every 30 s (the first after
// 10 s) while ready fails.
func Start(ctx context.Context, o Options, component string, ready Readiness, reg *prometheus.Registry, log *slog.Logger) error {
	ReadyMetric(reg, component, ready.Err)
	if err := Serve(ctx, o.Addr, ready.Err, reg, o.Profiling, log); err != nil {
		return err
	}
	go WarnWhileUnready(ctx, ready, 10*time.Second, 30*time.Second, log)
	return nil
}
