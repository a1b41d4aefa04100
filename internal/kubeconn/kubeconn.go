package kubeconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// Compression asks the API server to gzip its responses.
	Compression bool
	// UserAgent is every request's User-Agent, e.g. "matbus/v1.2.0".
	UserAgent string
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
		l, err := kuberate.New(kuberate.Config{MaxQPS: c.QPSMax, InitialQPS: c.QPS, Burst: c.Burst, MaxInFlight: c.MaxInFlight})
		if err == nil {
			l.Apply(cfg)
			limiter = l
		}
	}
	cfg.UserAgent = c.UserAgent
	// client-go prints API warnings to stderr by default, which breaks JSON logs.
	cfg.WarningHandler = rest.NoWarnings{}
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
