package kubeconn

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/matbus/matbus/internal/kubetls"
	"github.com/matbus/matbus/internal/reload"
	"github.com/matbus/matbus/kuberate"
)

// The client-side limits of Config.Rate.
const (
	// RateAdaptive is kuberate's limiter: a rate from QPS up to QPSMax and
	// at most MaxInFlight requests at once, cut when the API server pushes
	// back.
	RateAdaptive = "adaptive"
	// RateFixed is client-go's token bucket of QPS and Burst.
	RateFixed = "fixed"
)

// Config selects the cluster and the client's limits (the --kube-* flags).
type Config struct {
	// Kubeconfig is a kubeconfig file; empty: in-cluster configuration.
	Kubeconfig string
	// Rate is RateAdaptive (also when empty) or RateFixed.
	Rate string
	// QPS (requests per second) and Burst (requests) are the fixed rate
	// and bucket, or the adaptive limiter's start.
	QPS   float64
	Burst int
	// QPSMax (requests per second) and MaxInFlight (requests) are the
	// adaptive limiter's ceilings.
	QPSMax      float64
	MaxInFlight int
	// LatencyTolerance is the adaptive limiter's Tolerance: how many
	// times its baseline even the fastest write of a 100 ms period may
	// take before the in-flight limit is lowered (a standing queue).
	LatencyTolerance float64
	// Compression asks the API server to gzip its responses.
	Compression bool
	// UserAgent is every request's User-Agent, e.g. "matbus/v1.2.0".
	UserAgent string
	// Warnings, when set, reports the API server's warnings (logged once
	// each, counted); nil drops them.
	Warnings *Warnings
}

// AddFlags registers the --kubeconfig, --kube-rate, --kube-qps,
// --kube-burst, --kube-qps-max, --kube-max-inflight, --kube-latency-tolerance
// and --kube-compression
// flags on fs, with their defaults.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster configuration. The CA and client certificate files it names (and the in-cluster ca.crt) are re-read when they change and used from the next connection on; a token file is re-read by client-go; the kubeconfig itself is read once")
	fs.StringVar(&c.Rate, "kube-rate", RateAdaptive, "client-side limit of Kubernetes API requests, per process: "+
		"adaptive (a rate from --kube-qps up to --kube-qps-max and a limit of requests in flight up to --kube-max-inflight, "+
		"raised while the API server answers fast, cut on 429, Retry-After, 502/503/504 and rising write latency; see docs/adr/0022-adaptive-kube-rate.md) "+
		"or fixed (client-go's token bucket of --kube-qps and --kube-burst, nothing else)")
	fs.Float64Var(&c.QPS, "kube-qps", 200, "Kubernetes API requests per second, per process: the rate with --kube-rate=fixed, the starting rate with adaptive "+
		"(client-go's default of 5 is far too low for thousands of Services)")
	fs.IntVar(&c.Burst, "kube-burst", 400, "Kubernetes API requests sent at once above the rate after a quiet spell (the token bucket's depth), both modes")
	fs.Float64Var(&c.QPSMax, "kube-qps-max", 1000, "hard ceiling of the adaptive rate, Kubernetes API requests per second, per process (--kube-rate=adaptive; "+
		"on a small shared cluster use 15 with --kube-burst 30, see docs/performance.md)")
	fs.IntVar(&c.MaxInFlight, "kube-max-inflight", 64, "hard ceiling of Kubernetes API requests in flight at once, per process (--kube-rate=adaptive; watches not counted)")
	fs.Float64Var(&c.LatencyTolerance, "kube-latency-tolerance", 3, "with --kube-rate=adaptive, how many times its quickest latency (over 2 minutes) even the fastest Kubernetes write of a 100 ms period may take "+
		"before the limit of requests in flight is lowered (the API server holds a standing queue); higher keeps more requests in flight on a busy API server, at its other clients' expense (> 1)")
	fs.BoolVar(&c.Compression, "kube-compression", false, "ask the API server to gzip its responses, watch events included; "+
		"off by default, as for kube-controller-manager and kube-scheduler: on a cluster network gzip costs the API server and matbus CPU "+
		"(about 3 % of the API server's CPU during a delete fan-out here) and saves nothing that matters; turn it on across a slow link")
}

// Validate returns an error naming the flag for a limit that is not a
// positive number or an unknown --kube-rate.
func (c *Config) Validate() error {
	if !(c.QPS > 0) || math.IsInf(c.QPS, 0) || c.Burst <= 0 {
		return errors.New("--kube-qps and --kube-burst must be positive numbers")
	}
	switch c.Rate {
	case RateFixed:
	case RateAdaptive:
		if !(c.QPSMax > 0) || math.IsInf(c.QPSMax, 0) || c.MaxInFlight <= 0 {
			return errors.New("--kube-qps-max and --kube-max-inflight must be positive numbers")
		}
		if !(c.LatencyTolerance > 1) || math.IsInf(c.LatencyTolerance, 0) {
			return fmt.Errorf("--kube-latency-tolerance %v: must be a number above 1", c.LatencyTolerance)
		}
	default:
		return fmt.Errorf("--kube-rate %q: want adaptive or fixed", c.Rate)
	}
	return nil
}

// RESTConfig returns the client configuration from c.Kubeconfig or the
// in-cluster environment, with Apply's settings and the adaptive limiter
// (nil with RateFixed). The CA file and client certificate files it
// names are kept current until ctx ends (kubetls: a rotated CA or
// certificate is used from the next connection on, a bad file keeps the
// last good one with a warning to log); a token file is client-go's to
// re-read (at most a minute after it changes).
func RESTConfig(ctx context.Context, c Config, log *slog.Logger) (*rest.Config, *kuberate.Limiter, error) {
	var cfg *rest.Config
	var err error
	if c.Kubeconfig != "" {
		if err := reload.CheckReadable("kubeconfig "+c.Kubeconfig+" (--kubeconfig, KUBECONFIG)", c.Kubeconfig); err != nil {
			return nil, nil, err
		}
		cfg, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		if err != nil {
			return nil, nil, fmt.Errorf("kubeconfig %s (--kubeconfig, KUBECONFIG) is not usable: %w", c.Kubeconfig, err)
		}
	} else {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, nil, fmt.Errorf("no Kubernetes configuration: set --kubeconfig (or KUBECONFIG), or run in a cluster")
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes config: %w", err)
	}
	if _, err := kubetls.Apply(ctx, cfg, log); err != nil {
		return nil, nil, fmt.Errorf("kubernetes config: %w", err)
	}
	return cfg, Apply(cfg, c), nil
}

// Apply sets cfg's client-side limit, user agent, content types and
// compression. With RateAdaptive (or an empty rate) every client made from
// cfg, and from copies of it, shares one kuberate.Limiter, which it
// returns (nil otherwise, and for a limit kuberate refuses: the flags'
// validation refuses it first).
func Apply(cfg *rest.Config, c Config) *kuberate.Limiter {
	cfg.QPS, cfg.Burst = float32(c.QPS), c.Burst
	var limiter *kuberate.Limiter
	if c.Rate != RateFixed && c.QPSMax > 0 {
		l, err := kuberate.New(kuberate.Config{MaxQPS: c.QPSMax, InitialQPS: c.QPS, Burst: c.Burst, MaxInFlight: c.MaxInFlight, Tolerance: c.LatencyTolerance})
		if err == nil {
			l.Apply(cfg)
			limiter = l
		}
	}
	cfg.UserAgent = c.UserAgent
	// client-go prints API warnings to stderr by default, which breaks JSON
	// logs: they go to the process's log and metrics instead.
	if c.Warnings != nil {
		c.Warnings.Install(cfg)
	} else {
		cfg.WarningHandler = rest.NoWarnings{}
	}
	// Protobuf for built-in types (Services, Leases, Deployments) costs the
	// API server and matbus far less CPU than JSON, as for Kubernetes' own
	// controllers; JSON stays accepted.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	// Without this, Go's transport asks for gzip and the API server
	// compresses every watch event per flush (perFlushGzipWriter).
	cfg.DisableCompression = !c.Compression
	return limiter
}

// Client is kubernetes.NewForConfig with its error wrapped.
func Client(cfg *rest.Config) (kubernetes.Interface, error) {
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return kc, nil
}

// Reachable asks the API server for /version (any authenticated client
// may read it) within wait and returns nil, or an error naming the server
// and the cause.
func Reachable(ctx context.Context, kube kubernetes.Interface, host string, wait time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := kube.Discovery().RESTClient().Get().AbsPath("/version").Do(rctx).Error()
	if err == nil {
		return nil
	}
	if rctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("the Kubernetes API server at %s is not reachable (no answer in %s): %w", host, wait, err)
	}
	return fmt.Errorf("the Kubernetes API server at %s is not reachable: %w", host, err)
}

// UserAgent is the User-Agent of a matbus process's Kubernetes
// requests: "matbus/<version> (<subcommand>; <instance>[; <part>])", e.g.
// "matbus/v1.4.0 (worker; worker-0)" or "matbus/v1.4.0 (worker; worker-0;
// readiness)". The API server's audit log records it, so every request
// can be traced to the process and the part of it that sent it. Characters
// outside printable ASCII and the parentheses and semicolons of the
// format are replaced by '_' so a pod or host name cannot break it.
func UserAgent(version, subcommand, instance string, part ...string) string {
	fields := append([]string{subcommand, instance}, part...)
	for i, f := range fields {
		fields[i] = strings.Map(func(r rune) rune {
			if r < 0x21 || r > 0x7e || r == '(' || r == ')' || r == ';' {
				return '_'
			}
			return r
		}, f)
	}
	return "matbus/" + version + " (" + strings.Join(fields, "; ") + ")"
}
