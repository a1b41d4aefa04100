package main

import (
	"errors"
	"flag"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/matbus/matbus/kuberate"
)

// TestKubeRateFlags: adaptive (the default) puts one kuberate.Limiter into
// the configuration, starting at --kube-qps under the --kube-qps-max
// ceiling, and its metrics on the registry; --kube-rate=fixed is client-go's
// token bucket of --kube-qps / --kube-burst and nothing else; validation
// refuses an unknown mode and non-positive ceilings.
func TestKubeRateFlags(t *testing.T) {
	parse := func(args ...string) (*kubeOpts, error) {
		var o kubeOpts
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		o.register(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return &o, asUsage(o.Validate)()
	}
	o, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	o.apply(cfg)
	l, ok := cfg.RateLimiter.(*kuberate.Limiter)
	if !ok || o.limiter != l || cfg.WrapTransport == nil {
		t.Fatalf("default: RateLimiter %T, WrapTransport set %v; want the adaptive limiter in both", cfg.RateLimiter, cfg.WrapTransport != nil)
	}
	if s := l.Stats(); s.QPS != 200 || s.MaxQPS != 1000 || s.MaxInFlight != 64 {
		t.Errorf("default limiter: %+v, want 200 req/s under a 1000 ceiling, 64 in flight at most", s)
	}
	reg := prometheus.NewRegistry()
	o.registerMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) == 0 {
		t.Fatalf("metrics: %d families (%v)", len(mfs), err)
	}

	o, err = parse("--kube-rate=fixed", "--kube-qps=15", "--kube-burst=30")
	if err != nil {
		t.Fatal(err)
	}
	cfg = &rest.Config{Host: "https://127.0.0.1:1"}
	o.apply(cfg)
	if cfg.RateLimiter != nil || cfg.WrapTransport != nil || o.limiter != nil || cfg.QPS != 15 || cfg.Burst != 30 {
		t.Fatalf("fixed: RateLimiter %v, QPS %v, burst %d; want client-go's own bucket of 15 / 30", cfg.RateLimiter, cfg.QPS, cfg.Burst)
	}
	var _ flowcontrol.RateLimiter = l

	for _, args := range [][]string{{"--kube-rate=aimd"}, {"--kube-qps-max=0"}, {"--kube-max-inflight=0"}} {
		if _, err := parse(args...); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	if _, err := parse("--kube-rate=fixed", "--kube-qps-max=0"); err != nil {
		t.Errorf("--kube-qps-max is not used with fixed: %v", err)
	}
}
