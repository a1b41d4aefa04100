package deploytest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/plan"
)

// matbusSubcommands are the subcommands a compose service may run.
var matbusSubcommands = []string{"discovery", "worker", "errors", "matsim", "dev", "version"}

// loadCompose loads docker-compose.yaml with the compose-spec loader as
// `docker compose` would, with an empty environment (so the defaults of
// ${VAR:-default} apply).
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yaml")},
		cli.WithWorkingDirectory(root), cli.WithEnv(nil), cli.WithDiscardEnvFile, cli.WithResolvedPaths(true))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yaml does not load: %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("docker-compose.yaml has no service %q", name)
	}
	return s
}

// matbusImage is the image that compose builds from deploy/Dockerfile (the
// matbus-image service); "" when none builds.
func matbusImage(p *types.Project) string {
	if s, ok := p.Services["matbus-image"]; ok && s.Build != nil {
		return s.Image
	}
	return ""
}

// isMatbus tells the services that run the image built from deploy/Dockerfile.
func isMatbus(p *types.Project, s types.ServiceConfig) bool {
	return s.Image != "" && s.Image == matbusImage(p)
}

// flagValue returns the value of --name in args (--name=v or --name v).
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func mustFlag(t *testing.T, what string, args []string, name string) string {
	t.Helper()
	v, ok := flagValue(args, name)
	if !ok {
		t.Fatalf("%s: no --%s in %v", what, name, args)
	}
	return v
}

// hostPath maps a path inside a service's container to the bind-mounted
// file of the repository, or fails.
func hostPath(t *testing.T, s types.ServiceConfig, inContainer string) string {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == inContainer {
			if !strings.HasPrefix(v.Source, root) {
				t.Errorf("%s mounts %s from outside the repository", s.Name, v.Source)
			}
			if !v.ReadOnly {
				t.Errorf("%s mounts %s writable; configuration is mounted read-only", s.Name, v.Target)
			}
			return v.Source
		}
	}
	t.Fatalf("service %s uses %s but mounts no file there", s.Name, inContainer)
	return ""
}

func TestComposeServices(t *testing.T) {
	p := loadCompose(t)
	var names []string
	for n := range p.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"discovery", "errors", "etcd", "kube-apiserver", "kube-apiserver-ready", "matbus-image", "matsim-a", "matsim-b", "nats", "worker"}
	if !slices.Equal(names, want) {
		t.Fatalf("services %v, want %v", names, want)
	}
	w := service(t, p, "worker")
	if w.Deploy == nil || w.Deploy.Replicas == nil || *w.Deploy.Replicas != 2 {
		t.Errorf("worker: want deploy.replicas: 2")
	}
	// `--scale worker=N` needs no fixed container name and no host port.
	if w.ContainerName != "" || len(w.Ports) > 0 {
		t.Errorf("worker has container_name %q or ports %v; scaling it would conflict", w.ContainerName, w.Ports)
	}
	// Two simulators with different fleets.
	a, b := service(t, p, "matsim-a").Command, service(t, p, "matsim-b").Command
	if mustFlag(t, "matsim-a", a, "bmc-subnet") == mustFlag(t, "matsim-b", b, "bmc-subnet") ||
		mustFlag(t, "matsim-a", a, "seed") == mustFlag(t, "matsim-b", b, "seed") {
		t.Error("matsim-a and matsim-b must simulate different fleets (--bmc-subnet and --seed)")
	}
	if !strings.Contains(strings.Join(service(t, p, "nats").Command, " "), "-js") {
		t.Error("nats runs without JetStream (-js)")
	}
	if got := service(t, p, "errors").Command; len(got) == 0 || got[0] != "errors" {
		t.Errorf("errors service runs %v, want `matbus errors`", got)
	}
}

// TestComposeMatbusFlagsExist: each matbus service's subcommand, flags and
// environment variables exist in `matbus <subcommand> --help`.
func TestComposeMatbusFlagsExist(t *testing.T) {
	checkNonFlagEnv(t)
	p := loadCompose(t)
	n := 0
	for _, s := range p.Services {
		if !isMatbus(p, s) {
			continue
		}
		n++
		if len(s.Entrypoint) > 0 {
			t.Errorf("%s overrides the image's entrypoint (matbus)", s.Name)
		}
		if len(s.Command) == 0 || !slices.Contains(matbusSubcommands, s.Command[0]) {
			t.Errorf("%s: command %v does not start with a matbus subcommand", s.Name, s.Command)
			continue
		}
		sub := s.Command[0]
		if len(s.Command) == 1 && len(s.Environment) == 0 {
			continue // e.g. matbus-image's `version`: nothing to look up
		}
		checkArgs(t, "compose service "+s.Name, sub, s.Command[1:])
		var env []string
		for k := range s.Environment {
			env = append(env, k)
		}
		checkEnv(t, "compose service "+s.Name, sub, env)
	}
	if n < 6 {
		t.Errorf("only %d services run matbus; want matbus-image, matsim-a, matsim-b, discovery, worker and errors", n)
	}
}

// TestComposeImagesFromDockerfile: one service (matbus-image) builds the
// matbus image from deploy/Dockerfile, once; every other service on that
// image never pulls it and starts after the build; no other image is built.
func TestComposeImagesFromDockerfile(t *testing.T) {
	p := loadCompose(t)
	df := parseDockerfile(t)
	image := matbusImage(p)
	if image == "" {
		t.Fatal("no matbus-image service builds the matbus image")
	}
	users := 0
	for _, s := range p.Services {
		if s.Build != nil {
			if s.Name != "matbus-image" {
				t.Errorf("%s builds an image; only matbus-image builds (once for every service)", s.Name)
				continue
			}
			if s.Build.Context != root {
				t.Errorf("%s: build context %s, want the repository root", s.Name, s.Build.Context)
			}
			if s.Build.DockerfileInline != "" || filepath.Clean(s.Build.Dockerfile) != filepath.Join("deploy", "Dockerfile") && s.Build.Dockerfile != filepath.Join(root, "deploy", "Dockerfile") {
				t.Errorf("%s: builds from %q, want deploy/Dockerfile", s.Name, s.Build.Dockerfile)
			}
			for arg := range s.Build.Args {
				if !slices.Contains(df.args, arg) {
					t.Errorf("%s: build arg %s is not an ARG of deploy/Dockerfile", s.Name, arg)
				}
			}
			if s.Restart != "no" {
				t.Errorf("matbus-image is a one-shot; restart %q", s.Restart)
			}
			continue
		}
		if strings.HasPrefix(s.Image, "matbus") && s.Image != image || s.Image == "" {
			t.Errorf("%s uses image %q, want the one matbus image %q", s.Name, s.Image, image)
		}
		if s.Image != image {
			continue
		}
		users++
		if s.PullPolicy != types.PullPolicyNever {
			t.Errorf("%s: pull_policy %q; the matbus image is built by matbus-image, never pulled", s.Name, s.PullPolicy)
		}
		if got := s.DependsOn["matbus-image"].Condition; got != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s starts before the matbus image is built (depends_on matbus-image: %q)", s.Name, got)
		}
	}
	if users < 5 {
		t.Errorf("%d services run the matbus image; want matsim-a, matsim-b, discovery, worker and errors", users)
	}
}

// TestComposeHealthchecks: every long-running matbus service has a
// healthcheck (`matbus probe` on its readiness endpoint), so `docker compose
// up --wait` fails on a crash loop; the probed port is the one the process
// serves.
func TestComposeHealthchecks(t *testing.T) {
	p := loadCompose(t)
	for _, s := range p.Services {
		if !isMatbus(p, s) || s.Name == "matbus-image" {
			continue
		}
		if s.HealthCheck == nil || len(s.HealthCheck.Test) < 2 || s.HealthCheck.Disable {
			t.Errorf("%s has no healthcheck", s.Name)
			continue
		}
		test := s.HealthCheck.Test
		if test[0] != "CMD" || test[1] != "/usr/local/bin/matbus" || len(test) < 3 || test[2] != "probe" {
			t.Errorf("%s: healthcheck %v, want `matbus probe` (the image has no shell or curl)", s.Name, test)
			continue
		}
		checkArgs(t, "healthcheck of "+s.Name, "probe", test[3:])
		u, ok := flagValue(test[3:], "url")
		if !ok {
			t.Errorf("%s: healthcheck without --url", s.Name)
			continue
		}
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		sub := s.Command[0]
		addr := ":8080" // the default --health-addr of discovery and worker
		if sub == "matsim" {
			addr = mustFlag(t, s.Name, s.Command, "listen")
		} else if v, ok := flagValue(s.Command, "health-addr"); ok {
			addr = v
		} else if sub == "errors" {
			t.Errorf("%s: errors serves no health endpoint without --health-addr", s.Name)
			continue
		}
		_, port, _ := net.SplitHostPort(addr)
		if pu.Port() != port {
			t.Errorf("%s: healthcheck probes port %s, the process serves %s", s.Name, pu.Port(), port)
		}
		if sub != "matsim" && pu.Path != "/readyz" {
			t.Errorf("%s: healthcheck probes %s, want /readyz (healthy = working, not only alive)", s.Name, pu.Path)
		}
	}
}

// dockerfile is what the tests read of deploy/Dockerfile.
type dockerfile struct {
	args  []string // ARG names
	froms []string // FROM arguments
	final []string // instructions of the last stage
}

func parseDockerfile(t *testing.T) dockerfile {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var df dockerfile
	sc := bufio.NewScanner(f)
	var cont string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cont += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		line, cont = cont+line, ""
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "ARG":
			name, _, _ := strings.Cut(rest, "=")
			if !slices.Contains(df.args, name) {
				df.args = append(df.args, name)
			}
		case "FROM":
			df.froms = append(df.froms, rest)
			df.final = nil
		}
		df.final = append(df.final, line)
	}
	return df
}

// TestDockerfile: a multi-stage build of ./cmd/matbus whose base images are
// build arguments, ending in a non-root image whose entrypoint is matbus.
func TestDockerfile(t *testing.T) {
	df := parseDockerfile(t)
	if len(df.froms) < 2 {
		t.Fatalf("want a multi-stage build, got FROM %v", df.froms)
	}
	for _, from := range df.froms {
		ref := strings.Fields(strings.ReplaceAll(from, "--platform=$BUILDPLATFORM", ""))[0]
		if !regexp.MustCompile(`^\$\{[A-Z_]+\}$`).MatchString(ref) {
			t.Errorf("FROM %s: the base image must be a build argument (offline mirrors)", from)
		}
	}
	for _, a := range []string{"GO_IMAGE", "RUNTIME_IMAGE", "GOPROXY"} {
		if !slices.Contains(df.args, a) {
			t.Errorf("deploy/Dockerfile has no ARG %s", a)
		}
	}
	final := strings.Join(df.final, "\n")
	user := regexp.MustCompile(`(?m)^USER (\d+)(:\d+)?$`).FindStringSubmatch(final)
	if user == nil || user[1] == "0" {
		t.Errorf("the runtime stage must set a numeric non-root USER, got:\n%s", final)
	}
	if !strings.Contains(final, `ENTRYPOINT ["/usr/local/bin/matbus"]`) || !strings.Contains(final, "COPY --from=build /out/matbus /usr/local/bin/matbus") {
		t.Errorf("the runtime stage must hold only the matbus binary as entrypoint:\n%s", final)
	}
	b, _ := os.ReadFile(filepath.Join(root, "deploy", "Dockerfile"))
	if !strings.Contains(string(b), "CGO_ENABLED=0") || !strings.Contains(string(b), "./cmd/matbus") {
		t.Error("the build stage must build ./cmd/matbus statically (CGO_ENABLED=0)")
	}
}

// TestComposeStartOrder: every dependency on a healthy service has a
// healthcheck to wait for, and the parts start in order.
func TestComposeStartOrder(t *testing.T) {
	p := loadCompose(t)
	want := map[string]map[string]string{
		"kube-apiserver":       {"etcd": types.ServiceConditionHealthy},
		"kube-apiserver-ready": {"kube-apiserver": types.ServiceConditionStarted},
		"discovery": {"nats": types.ServiceConditionHealthy, "kube-apiserver-ready": types.ServiceConditionCompletedSuccessfully,
			"matsim-a": types.ServiceConditionHealthy, "matsim-b": types.ServiceConditionHealthy},
		"worker": {"nats": types.ServiceConditionHealthy, "kube-apiserver-ready": types.ServiceConditionCompletedSuccessfully},
		"errors": {"nats": types.ServiceConditionHealthy},
	}
	for name, deps := range want {
		s := service(t, p, name)
		for dep, cond := range deps {
			if got := s.DependsOn[dep].Condition; got != cond {
				t.Errorf("%s depends on %s with condition %q, want %q", name, dep, got, cond)
			}
		}
	}
	for _, s := range p.Services {
		for dep, d := range s.DependsOn {
			target := service(t, p, dep)
			if d.Condition == types.ServiceConditionHealthy && (target.HealthCheck == nil || len(target.HealthCheck.Test) == 0) {
				t.Errorf("%s waits for %s to be healthy, which has no healthcheck", s.Name, dep)
			}
			if d.Condition == types.ServiceConditionCompletedSuccessfully && target.Restart != "no" {
				t.Errorf("%s waits for %s to complete, which restarts (%q)", s.Name, dep, target.Restart)
			}
		}
	}
}

// TestComposeVersionsMatchTests: compose runs the versions the tests run:
// NATS as go.mod's nats-server, kube-apiserver and etcd as tools/k8s.
func TestComposeVersionsMatchTests(t *testing.T) {
	p := loadCompose(t)
	natsV := moduleVersion(t, "go.mod", "github.com/nats-io/nats-server/v2")
	k8sV := moduleVersion(t, "tools/k8s/go.mod", "k8s.io/kubernetes")
	etcdV := moduleVersion(t, "tools/k8s/go.mod", "go.etcd.io/etcd/server/v3")
	for svc, want := range map[string]string{
		"nats":           "nats:" + strings.TrimPrefix(natsV, "v") + "-alpine",
		"kube-apiserver": "registry.k8s.io/kube-apiserver:" + k8sV,
		"etcd":           "registry.k8s.io/etcd:" + strings.TrimPrefix(etcdV, "v") + "-0",
	} {
		if got := service(t, p, svc).Image; got != want {
			t.Errorf("%s image %q, want %q (the version the tests run)", svc, got, want)
		}
	}
}

func moduleVersion(t *testing.T, gomod, module string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, gomod))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(module) + `\s+(v\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s does not require %s", gomod, module)
	}
	return string(m[1])
}

// TestComposeWiring checks that the parts point at each other: URLs, ports,
// mounted files, token and service range.
func TestComposeWiring(t *testing.T) {
	p := loadCompose(t)
	api := service(t, p, "kube-apiserver")
	apiArgs := api.Command
	rangeStr := mustFlag(t, "kube-apiserver", apiArgs, "service-cluster-ip-range")
	svcRange := netip.MustParsePrefix(rangeStr)
	port := mustFlag(t, "kube-apiserver", apiArgs, "secure-port")

	// Every BMC IP becomes a cluster IP: each simulator's subnet lies in the range.
	sims := map[string]string{} // host:port -> scheme
	for _, name := range []string{"matsim-a", "matsim-b"} {
		args := service(t, p, name).Command
		sub := netip.MustParsePrefix(mustFlag(t, name, args, "bmc-subnet"))
		if !svcRange.Contains(sub.Addr()) || sub.Bits() < svcRange.Bits() {
			t.Errorf("%s --bmc-subnet %s is not inside the service range %s", name, sub, svcRange)
		}
		_, lport, err := net.SplitHostPort(mustFlag(t, name, args, "listen"))
		if err != nil {
			t.Fatal(err)
		}
		scheme := "http"
		if slices.Contains(args, "--tls") || slices.Contains(args, "--tls=true") {
			scheme = "https"
		}
		sims[net.JoinHostPort(name, lport)] = scheme
	}
	w := service(t, p, "worker")
	if got := mustFlag(t, "worker", w.Command, "service-cidr"); got != rangeStr {
		t.Errorf("worker --service-cidr %s, want the API server's range %s", got, rangeStr)
	}
	anyTLS := false
	for _, scheme := range sims {
		anyTLS = anyTLS || scheme == "https"
	}
	if v := w.Environment["INSECURE_SKIP_VERIFY"]; anyTLS && (v == nil || *v != "true") {
		t.Error("the simulators serve self-signed HTTPS; the worker needs INSECURE_SKIP_VERIFY=true")
	}

	// The discovery publisher's static list names both simulators.
	d := service(t, p, "discovery")
	entries, err := discovery.LoadStaticFile(hostPath(t, d, mustFlag(t, "discovery", d.Command, "static-file")))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		u, err := url.Parse(e.URL)
		if err != nil {
			t.Fatal(err)
		}
		scheme, ok := sims[u.Host]
		if !ok || scheme != u.Scheme {
			t.Errorf("static instance %s: URL %s is not a simulator of the compose file (%v)", e.Name, e.URL, sims)
		}
		seen[u.Host] = true
	}
	if len(seen) != len(sims) {
		t.Errorf("static list covers %v, want every simulator %v", seen, sims)
	}

	// NATS: the shipped configuration, and every matbus service with the
	// user of its part and the password nats-server reads.
	n := service(t, p, "nats")
	if conf := mustFlag(t, "nats", n.Command, "config"); hostPath(t, n, filepath.Dir(conf)) != filepath.Join(root, "deploy", "nats") ||
		filepath.Base(conf) != "nats-server.conf" {
		t.Errorf("nats runs with -c %s, want deploy/nats/nats-server.conf mounted as it is", conf)
	}
	users := map[string]string{"discovery": "discovery", "worker": "worker", "errors": "reader"}
	for _, s := range p.Services {
		if !isMatbus(p, s) || s.Command[0] == "matsim" || s.Name == "matbus-image" {
			continue
		}
		user, ok := users[s.Name]
		if !ok {
			t.Errorf("%s: which NATS user it runs as is not known to this test", s.Name)
			continue
		}
		pw := n.Environment["MATBUS_"+strings.ToUpper(user)+"_PASSWORD"]
		v := s.Environment["MATBUS_NATS_URL"]
		if pw == nil || *pw == "" || v == nil || *v != "nats://"+user+":"+*pw+"@nats:4222" {
			t.Errorf("%s: MATBUS_NATS_URL %v, want nats://%s:<nats's MATBUS_%s_PASSWORD>@nats:4222", s.Name, v, user, strings.ToUpper(user))
		}
	}

	// Kubeconfigs: the containers' points at the API server on the compose
	// network, the host's at the published port; both carry a token of the
	// API server's token file.
	tokens := readTokens(t, hostPath(t, api, mustFlag(t, "kube-apiserver", apiArgs, "token-auth-file")))
	published := ""
	for _, pc := range api.Ports {
		if strconv.FormatUint(uint64(pc.Target), 10) == port {
			published = net.JoinHostPort(pc.HostIP, pc.Published)
		}
	}
	if published == "" {
		t.Fatalf("kube-apiserver does not publish port %s", port)
	}
	for _, kc := range []struct{ file, server string }{
		{hostPath(t, w, *w.Environment["KUBECONFIG"]), "https://" + net.JoinHostPort("kube-apiserver", port)},
		{hostPath(t, d, *d.Environment["KUBECONFIG"]), "https://" + net.JoinHostPort("kube-apiserver", port)},
		{filepath.Join(root, "deploy", "compose", "kubeconfig.host"), "https://" + published},
	} {
		cfg, err := clientcmd.BuildConfigFromFlags("", kc.file)
		if err != nil {
			t.Fatalf("%s: %v", kc.file, err)
		}
		if cfg.Host != kc.server || !slices.Contains(tokens, cfg.BearerToken) {
			t.Errorf("%s: server %s with a token of tokens.csv, want %s", kc.file, cfg.Host, kc.server)
		}
	}
	ready := service(t, p, "kube-apiserver-ready").Command
	if last := ready[len(ready)-1]; last != "https://"+net.JoinHostPort("kube-apiserver", port)+"/readyz" {
		t.Errorf("the readiness gate asks %s", last)
	}
}

func readTokens(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		tok, _, _ := strings.Cut(l, ",")
		out = append(out, tok)
	}
	return out
}

// TestComposeControlPlaneStarts runs the compose file's etcd and
// kube-apiserver command lines with the real binaries built from the same
// versions (only addresses and the container paths are mapped to this
// machine, through the service's own volume mounts), then: the readiness
// gate's curl command succeeds, the containers' kubeconfig token is an
// admin, and a Service can take a cluster IP from each simulator's BMC
// subnet (one outside the range is refused, so the check can fail).
func TestComposeControlPlaneStarts(t *testing.T) {
	p := loadCompose(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp := startControlPlane(t, p)
	port, apiPort, api := cp.port, cp.apiPort, cp.log

	// The readiness gate, as compose runs it (curl retries until /readyz is 200).
	gate := service(t, p, "kube-apiserver-ready").Command
	gateArgs := make([]string, len(gate))
	for i, a := range gate {
		gateArgs[i] = strings.Replace(a, "kube-apiserver:"+port, "127.0.0.1:"+apiPort, 1)
	}
	if curl, err := exec.LookPath("curl"); err == nil {
		// Before /readyz says ok it refuses (connection refused, then 403
		// until the RBAC roles exist, then 500): curl must retry them all.
		cmd := exec.CommandContext(ctx, curl, gateArgs...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("readiness gate `curl %s`: %v\n%s%s\nkube-apiserver:\n%s", strings.Join(gateArgs, " "), err, out, stderr.String(), lastLines(api.Bytes(), 20))
		}
	} else {
		t.Logf("curl not installed: waiting for /readyz without the gate's command line")
		waitFor(t, ctx, "kube-apiserver /readyz", func() bool { return anonymousReady(gateArgs[len(gateArgs)-1]) })
	}

	// The containers' kubeconfig, pointed at this API server.
	w := service(t, p, "worker")
	cfg, err := clientcmd.BuildConfigFromFlags("", hostPath(t, w, *w.Environment["KUBECONFIG"]))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = "https://127.0.0.1:" + apiPort
	kube := kubernetes.NewForConfigOrDie(cfg)
	create := func(name, ip string) error {
		_, err := kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Name: "redfish", Port: 443}}},
		}, metav1.CreateOptions{})
		return err
	}
	for _, name := range []string{"matsim-a", "matsim-b"} {
		sub := netip.MustParsePrefix(mustFlag(t, name, service(t, p, name).Command, "bmc-subnet"))
		ip := sub.Addr().Next()
		if err := create("bmc-"+name, ip.String()); err != nil {
			t.Errorf("a Service on %s's BMC IP %s: %v", name, ip, err)
		}
	}
	if err := create("outside", "192.0.2.10"); !apierrors.IsInvalid(err) {
		t.Errorf("a cluster IP outside the service range was not refused: %v", err)
	}
}

// controlPlane is the compose file's etcd and kube-apiserver run here.
type controlPlane struct {
	port    string // the API server's port in compose
	apiPort string // and here
	log     *process
}

func startControlPlane(t *testing.T, p *types.Project) controlPlane {
	t.Helper()
	etcdBin, apiBin := tool(t, "etcd"), tool(t, "kube-apiserver")
	etcdSvc := service(t, p, "etcd")
	if filepath.Base(etcdSvc.Command[0]) != "etcd" {
		t.Fatalf("etcd service runs %s", etcdSvc.Command[0])
	}
	clientPort, peerPort := freePort(t), freePort(t)
	etcdArgs := localize(t, etcdSvc, etcdSvc.Command[1:], map[string]string{
		"0.0.0.0:2379": "127.0.0.1:" + clientPort, "etcd:2379": "127.0.0.1:" + clientPort,
		"127.0.0.1:2380": "127.0.0.1:" + peerPort,
	})
	startProcess(t, "etcd", etcdBin, etcdArgs, nil)

	apiSvc := service(t, p, "kube-apiserver")
	if apiSvc.Command[0] != "kube-apiserver" {
		t.Fatalf("kube-apiserver service runs %s", apiSvc.Command[0])
	}
	cp := controlPlane{port: mustFlag(t, "kube-apiserver", apiSvc.Command, "secure-port"), apiPort: freePort(t)}
	apiArgs := localize(t, apiSvc, apiSvc.Command[1:], map[string]string{
		"http://etcd:2379": "http://127.0.0.1:" + clientPort, "--bind-address=0.0.0.0": "--bind-address=127.0.0.1",
		"--secure-port=" + cp.port: "--secure-port=" + cp.apiPort,
	})
	cp.log = startProcess(t, "kube-apiserver", apiBin, apiArgs, nil)
	return cp
}

// localize maps a compose command line to this machine: each address in
// addrs, and each container path mounted by the service (bind mounts to
// their repository file, volumes and tmpfs to a new temporary folder).
func localize(t *testing.T, s types.ServiceConfig, args []string, addrs map[string]string) []string {
	t.Helper()
	var pairs []string
	for from, to := range addrs {
		pairs = append(pairs, from, to)
	}
	for _, v := range s.Volumes {
		src := v.Source
		if v.Type != types.VolumeTypeBind {
			src = t.TempDir()
		}
		pairs = append(pairs, v.Target, src)
	}
	for _, tmp := range s.Tmpfs {
		pairs = append(pairs, tmp, t.TempDir())
	}
	r := strings.NewReplacer(pairs...)
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = r.Replace(a)
	}
	return out
}

// process is a binary startProcess runs until the test ends.
type process struct {
	*syncBuffer // its output
	done        chan struct{}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func startProcess(t *testing.T, name, bin string, args, env []string) *process {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = env
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("--- %s %s\n%s", name, strings.Join(args, " "), lastLines(out.Bytes(), 30))
		}
	})
	return &process{syncBuffer: out, done: done}
}

func freePort(t *testing.T) string {
	t.Helper()
	p, err := kubelocal.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p)
}

func anonymousReady(u string) bool {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Get(u)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestComposeUpWithoutDocker runs what `docker compose up` runs, as
// processes on this machine: the compose file's nats-server, etcd and
// kube-apiserver command lines on binaries of the pinned versions, and every
// matbus service with its command, environment and mounted files (the
// worker with its deploy.replicas). Only host names and ports are mapped
// (each container has its own network namespace under compose, so the
// health port is moved to a free one too). It waits until every BMC the two
// simulators report has its Service, as a user of compose would see.
func TestComposeUpWithoutDocker(t *testing.T) {
	p := loadCompose(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp := startControlPlane(t, p)
	waitFor(t, ctx, "kube-apiserver /readyz", func() bool { return anonymousReady("https://127.0.0.1:" + cp.apiPort + "/readyz") })

	// NATS: the compose command line on nats-server built from go.mod's
	// version (the one the image tag pins), on free ports; then the
	// healthcheck's URL must answer 200.
	natsSvc := service(t, p, "nats")
	natsPort, monPort := freePort(t), freePort(t)
	natsArgs := append(localize(t, natsSvc, natsSvc.Command, map[string]string{"8222": monPort}), "-a", "127.0.0.1", "-p", natsPort)
	var natsEnv []string // the passwords its configuration reads
	for k, v := range natsSvc.Environment {
		if v != nil {
			natsEnv = append(natsEnv, k+"="+*v)
		}
	}
	natsProc := startProcess(t, "nats-server", natsServer(t), natsArgs, natsEnv)
	hc := natsSvc.HealthCheck.Test
	health := strings.Replace(hc[len(hc)-1], "127.0.0.1:8222", "127.0.0.1:"+monPort, 1)
	waitFor(t, ctx, "the nats healthcheck "+health, func() bool {
		resp, err := http.Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	addrs := map[string]string{"nats:4222": "127.0.0.1:" + natsPort, "kube-apiserver:" + cp.port: "127.0.0.1:" + cp.apiPort}
	for _, name := range []string{"matsim-a", "matsim-b"} {
		_, lport, _ := net.SplitHostPort(mustFlag(t, name, service(t, p, name).Command, "listen"))
		addrs[name+":"+lport] = "127.0.0.1:" + freePort(t)
	}

	// Start in the order compose would: simulators, discovery, workers, errors.
	logs := map[string]*process{}
	for _, name := range []string{"matsim-a", "matsim-b", "discovery", "worker", "errors"} {
		s := service(t, p, name)
		local := maps.Clone(addrs)
		if s.Command[0] == "matsim" {
			lhost, lport, _ := net.SplitHostPort(mustFlag(t, name, s.Command, "listen"))
			local[net.JoinHostPort(lhost, lport)] = addrs[name+":"+lport]
		}
		args := localizeFiles(t, s, s.Command, local)
		for i := 1; i < len(args); i++ { // one host for every container here
			if args[i-1] == "--health-addr" {
				args[i] = "127.0.0.1:0"
			}
		}
		for i := 0; i < max(1, s.GetScale()); i++ { // deploy.replicas
			env := []string{"HOME=" + t.TempDir()}
			for k, v := range s.Environment {
				if v != nil {
					env = append(env, k+"="+localizeFiles(t, s, []string{*v}, local)[0])
				}
			}
			if s.Command[0] == "worker" || s.Command[0] == "discovery" || s.Command[0] == "errors" {
				env = append(env, "MATBUS_HEALTH_ADDR=127.0.0.1:0")
			}
			if s.Command[0] == "discovery" { // one host for every container here
				env = append(env, "MATBUS_SOURCE_LIST_ADDR=127.0.0.1:0")
			}
			id := fmt.Sprintf("%s-%d", name, i+1)
			logs[id] = startProcess(t, id, matbus(t), args, env)
		}
	}

	// The simulators log how many BMCs they serve.
	expected := 0
	for _, id := range []string{"matsim-a-1", "matsim-b-1"} {
		var n int
		waitFor(t, ctx, id+" serving", func() bool {
			m := regexp.MustCompile(`matsim serving.*bmcs=(\d+)`).FindSubmatch(logs[id].Bytes())
			if m != nil {
				n, _ = strconv.Atoi(string(m[1]))
			}
			return m != nil
		})
		expected += n
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(root, "deploy", "compose", "kubeconfig.host"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = "https://127.0.0.1:" + cp.apiPort
	kube := kubernetes.NewForConfigOrDie(cfg)
	ns := *service(t, p, "worker").Environment["NAMESPACE"]
	var got int
	waitFor(t, ctx, fmt.Sprintf("%d BMC Services in namespace %s", expected, ns), func() bool {
		// BMC Services: the simulators' switches also get NVOS Services.
		l, err := kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: plan.LabelManagedBy + "=" + plan.DefaultManagedBy +
			"," + plan.LabelMachineType + "!=" + string(plan.MachineTypeNVOS)})
		if err == nil {
			got = len(l.Items)
		}
		return got == expected
	})
	if !strings.Contains(string(logs["discovery-1"].Bytes()), "msg=leading") {
		t.Errorf("discovery did not lead:\n%s", lastLines(logs["discovery-1"].Bytes(), 10))
	}
	for id, l := range logs {
		if l.exited() {
			t.Errorf("%s exited:\n%s", id, lastLines(l.Bytes(), 10))
		}
		if strings.Contains(string(l.Bytes()), "level=ERROR") {
			t.Errorf("%s logged an error:\n%s", id, lastLines(l.Bytes(), 10))
		}
	}
	if n := strings.Count(string(natsProc.Bytes()), "Violation"); n > 0 {
		t.Errorf("nats-server logged %d permission violations:\n%s", n, lastLines(natsProc.Bytes(), 20))
	}
	w := service(t, p, "worker")
	t.Logf("converged: %d BMC Services from 2 simulators, %d workers", got, w.GetScale())
}

// localizeFiles is localize for matbus services whose mounted files name
// compose hosts: each bind-mounted file is copied with addrs replaced.
func localizeFiles(t *testing.T, s types.ServiceConfig, args []string, addrs map[string]string) []string {
	t.Helper()
	var pairs []string
	for from, to := range addrs {
		pairs = append(pairs, from, to)
	}
	hosts := strings.NewReplacer(pairs...)
	files := map[string]string{}
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		b, err := os.ReadFile(v.Source)
		if err != nil {
			t.Fatal(err)
		}
		local := filepath.Join(t.TempDir(), filepath.Base(v.Source))
		if err := os.WriteFile(local, []byte(hosts.Replace(string(b))), 0o600); err != nil {
			t.Fatal(err)
		}
		files[v.Target] = local
	}
	out := make([]string, len(args))
	for i, a := range args {
		a = hosts.Replace(a)
		if f, ok := files[a]; ok {
			a = f
		}
		out[i] = a
	}
	return out
}
