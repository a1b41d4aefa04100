package deploytest

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/matbus/matbus/discovery"
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

// isMatbus tells the services that run the image built from deploy/Dockerfile.
func isMatbus(s types.ServiceConfig) bool { return s.Build != nil }

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
	want := []string{"discovery", "errors", "etcd", "kube-apiserver", "kube-apiserver-ready", "matsim-a", "matsim-b", "nats", "worker"}
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
		if !isMatbus(s) {
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
		checkArgs(t, "compose service "+s.Name, sub, s.Command[1:])
		var env []string
		for k := range s.Environment {
			env = append(env, k)
		}
		checkEnv(t, "compose service "+s.Name, sub, env)
	}
	if n < 5 {
		t.Errorf("only %d services run matbus; want matsim-a, matsim-b, discovery, worker and errors", n)
	}
}

// TestComposeImagesFromDockerfile: every image compose builds comes from
// deploy/Dockerfile, and every service on the matbus image builds it.
func TestComposeImagesFromDockerfile(t *testing.T) {
	p := loadCompose(t)
	df := parseDockerfile(t)
	var image string
	for _, s := range p.Services {
		if s.Build == nil {
			if strings.HasPrefix(s.Image, "matbus") || s.Image == "" {
				t.Errorf("%s uses image %q without building it from deploy/Dockerfile", s.Name, s.Image)
			}
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
		if image == "" {
			image = s.Image
		} else if s.Image != image {
			t.Errorf("%s: image %q, want the one matbus image %q", s.Name, s.Image, image)
		}
	}
	if image == "" {
		t.Fatal("compose builds no image")
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
			"matsim-a": types.ServiceConditionStarted, "matsim-b": types.ServiceConditionStarted},
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

	// NATS URL of every matbus service.
	for _, s := range p.Services {
		if !isMatbus(s) || s.Command[0] == "matsim" {
			continue
		}
		v := s.Environment["MATBUS_NATS_URL"]
		if v == nil || *v != "nats://nats:4222" {
			t.Errorf("%s: MATBUS_NATS_URL %v, want nats://nats:4222", s.Name, v)
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
