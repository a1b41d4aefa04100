package kubeconn

import (
	"flag"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func parse(t *testing.T, args ...string) *Config {
	t.Helper()
	var c Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &c
}

// TestValidate names the flag of a limit that is not a positive number
// and of an unknown mode.
func TestValidate(t *testing.T) {
	if err := parse(t).Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kube-qps=0"}, "--kube-qps and --kube-burst"},
		{[]string{"--kube-burst=-1"}, "--kube-qps and --kube-burst"},
		{[]string{"--kube-qps-max=0"}, "--kube-qps-max and --kube-max-inflight"},
		{[]string{"--kube-rate=fast"}, `--kube-rate "fast"`},
		{[]string{"--kube-latency-tolerance=1"}, "--kube-latency-tolerance 1: must be a number above 1"},
		{[]string{"--kube-latency-tolerance=NaN"}, "--kube-latency-tolerance NaN"},
	} {
		if err := parse(t, tc.args...).Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
	if err := parse(t, "--kube-rate=fixed", "--kube-qps-max=0").Validate(); err != nil {
		t.Errorf("fixed ignores the adaptive ceilings: %v", err)
	}
}

// TestApply: the adaptive limiter is returned and installed, the fixed
// mode is client-go's bucket alone; both set protobuf, the user agent and
// compression off unless asked.
func TestApply(t *testing.T) {
	c := parse(t)
	c.UserAgent = "matbus/test"
	cfg := &rest.Config{}
	l := Apply(cfg, *c)
	if l == nil || cfg.RateLimiter == nil || cfg.UserAgent != "matbus/test" || !cfg.DisableCompression ||
		!strings.HasPrefix(cfg.ContentType, "application/vnd.kubernetes.protobuf") {
		t.Errorf("adaptive: limiter %v, config %+v", l, cfg)
	}
	c = parse(t, "--kube-rate=fixed", "--kube-qps=15", "--kube-burst=30", "--kube-compression")
	cfg = &rest.Config{}
	if l := Apply(cfg, *c); l != nil || cfg.RateLimiter != nil || cfg.QPS != 15 || cfg.Burst != 30 || cfg.DisableCompression {
		t.Errorf("fixed: limiter %v, config %+v", l, cfg)
	}
}

// TestUserAgent keeps a host name from breaking the format.
func TestUserAgent(t *testing.T) {
	if got, want := UserAgent("v1", "worker", "w-0", "readiness"), "matbus/v1 (worker; w-0; readiness)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if got, want := UserAgent("v1", "worker", "a b;(c)\n"), "matbus/v1 (worker; a_b__c__)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
