package composee2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
)

// The compose file's names this test relies on.
const (
	project   = "matbus"               // docker-compose.yaml's top-level name
	namespace = "default"              // NAMESPACE of discovery and worker
	curlSvc   = "kube-apiserver-ready" // a curl image on the compose network
)

// simulators are the MAT simulators and the instance each one is.
var simulators = []struct{ service, instance, url string }{
	{"matsim-a", namespace + ".mat-a", "https://matsim-a:1266"},
	{"matsim-b", namespace + ".mat-b", "https://matsim-b:1266"},
}

// TestComposeE2E: `docker compose up --wait` succeeds; every simulated BMC
// gets its Service in the compose kube-apiserver; four workers all take
// jobs; a stopped simulator makes the errors service print a fetch error and
// deletes none of its Services; a NATS restart is recovered from (a change
// made after it converges); an unreadable kubeconfig fails clearly;
// `docker compose down -v` leaves nothing behind.
func TestComposeE2E(t *testing.T) {
	if os.Getenv("MATBUS_COMPOSE_E2E") != "1" {
		t.Skip("needs a container engine: run `make compose-e2e` (hack/compose-e2e.sh)")
	}
	c := newCompose(t)
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Minute)
	defer cancel()

	c.step("up --wait", func() {
		c.run("up", "--detach", "--wait", "--wait-timeout", "300")
	})
	kube := c.kube()

	// The BMCs each simulator serves, read on the compose network with the
	// curl image and decoded by matclient.
	want := map[string]map[string]bool{} // instance -> BMC IPs
	c.step("every simulated BMC has its Service", func() {
		for _, s := range simulators {
			want[s.instance] = c.bmcIPs(s.url)
		}
		waitFor(t, ctx, 3*time.Minute, "a Service for every simulated BMC", func() (bool, string) {
			got, err := serviceIPs(ctx, kube)
			if err != nil {
				return false, err.Error()
			}
			var missing []string
			for inst, ips := range want {
				for ip := range ips {
					if !got[inst][ip] {
						missing = append(missing, inst+"/"+ip)
					}
				}
				if len(got[inst]) != len(ips) {
					missing = append(missing, fmt.Sprintf("%s has %d Services for %d BMCs", inst, len(got[inst]), len(ips)))
				}
			}
			return len(missing) == 0, fmt.Sprintf("missing %v", missing)
		})
		for _, s := range simulators {
			t.Logf("%s: %d BMCs, each with its Service", s.instance, len(want[s.instance]))
		}
	})

	c.step("--scale worker=4: four ready workers share the jobs", func() {
		c.run("up", "--detach", "--wait", "--wait-timeout", "300", "--scale", "worker=4")
		workers := c.containers("worker")
		if len(workers) != 4 {
			t.Fatalf("%d worker containers after --scale worker=4: %v", len(workers), workers)
		}
		for _, w := range workers {
			if h := c.docker("inspect", "--format", "{{.State.Health.Status}}", w); strings.TrimSpace(h) != "healthy" {
				t.Fatalf("worker %s is %s", w, h)
			}
		}
		jobs := map[string]int{}
		waitFor(t, ctx, 4*time.Minute, "every worker took a sync job", func() (bool, string) {
			for _, w := range workers {
				if jobs[w] == 0 {
					jobs[w] = c.syncJobs(w)
				}
			}
			for _, w := range workers {
				if jobs[w] == 0 {
					return false, fmt.Sprintf("sync jobs per worker: %v", jobs)
				}
			}
			return true, ""
		})
		t.Logf("sync jobs done per worker (matbus_worker_syncs_total + matbus_worker_syncs_unchanged_total): %v", jobs)
	})

	c.step("a stopped simulator: fetch error, no Service deleted", func() {
		sim := simulators[1]
		before, err := services(ctx, kube, sim.instance)
		if err != nil {
			t.Fatal(err)
		}
		c.run("stop", sim.service)
		var lines []string
		waitFor(t, ctx, 3*time.Minute, "two fetch errors of "+sim.instance+" printed by the errors service", func() (bool, string) {
			lines = nil
			for _, l := range strings.Split(c.run("logs", "--no-color", "--no-log-prefix", "errors"), "\n") {
				if strings.Contains(l, " fetch ") && strings.Contains(l, "instance="+sim.instance) {
					lines = append(lines, l)
				}
			}
			return len(lines) >= 2, fmt.Sprintf("%d fetch errors", len(lines))
		})
		t.Logf("the errors service printed (first and latest):\n%s\n%s", lines[0], lines[len(lines)-1])
		after, err := services(ctx, kube, sim.instance)
		if err != nil {
			t.Fatal(err)
		}
		if !equalUIDs(before, after) {
			t.Fatalf("Services of %s changed while it was stopped:\nbefore %v\nafter  %v", sim.instance, before, after)
		}
		c.run("start", sim.service)
		c.run("up", "--detach", "--wait", "--wait-timeout", "300", "--scale", "worker=4")
	})

	c.step("restart nats: the pipeline recovers", func() {
		c.run("restart", "nats")
		c.run("up", "--detach", "--wait", "--wait-timeout", "300", "--scale", "worker=4")
		// Sync jobs reach the workers only through NATS: their count goes on
		// rising after the restart.
		workers := c.containers("worker")
		total := func() int {
			n := 0
			for _, w := range workers {
				n += c.syncJobs(w)
			}
			return n
		}
		base := total()
		waitFor(t, ctx, 3*time.Minute, "sync jobs completed after the NATS restart", func() (bool, string) {
			n := total()
			return n >= base+len(simulators), fmt.Sprintf("%d sync jobs, %d at the restart", n, base)
		})
		// A change after the restart: delete a BMC Service; a sync job
		// (published and consumed through the restarted server) recreates it.
		inst := simulators[0].instance
		svcs, err := services(ctx, kube, inst)
		if err != nil || len(svcs) == 0 {
			t.Fatalf("no Services of %s: %v", inst, err)
		}
		victim := svcs[0]
		if err := kube.CoreV1().Services(namespace).Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, 3*time.Minute, "Service "+victim.Name+" recreated after the NATS restart", func() (bool, string) {
			s, err := kube.CoreV1().Services(namespace).Get(ctx, victim.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return s.UID != victim.UID, "still the old one"
		})
	})

	c.step("a crash loop fails up --wait", func() {
		// The workers with an invalid setting exit at once and are
		// restarted (restart: unless-stopped): their healthcheck never
		// passes, so `up --wait` must fail rather than report success.
		override := filepath.Join(t.TempDir(), "crash-loop.yaml")
		if err := os.WriteFile(override, []byte("services:\n  worker:\n    environment:\n      MATBUS_KUBE_QPS: \"-1\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, code := c.tryCompose("-f", "docker-compose.yaml", "-f", override, "up", "--detach", "--wait", "--wait-timeout", "90", "--scale", "worker=4", "worker")
		if code == 0 {
			t.Fatalf("up --wait succeeded with crash-looping workers:\n%s", out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		t.Logf("up --wait exited %d: %s", code, lines[len(lines)-1])
		// It failed because of the crash loop: the workers run with the
		// invalid setting, exit with the usage error and are restarted.
		for _, w := range c.containers("worker") {
			st := strings.Fields(c.docker("inspect", "--format", "{{.RestartCount}} {{.State.ExitCode}} {{range .Config.Env}}{{if eq . \"MATBUS_KUBE_QPS=-1\"}}invalid-qps{{end}}{{end}}", w))
			logs, _ := c.tryDocker("logs", "--tail", "5", w)
			if len(st) < 3 || st[2] != "invalid-qps" || !strings.Contains(logs, "--kube-qps") {
				t.Fatalf("worker %s (restarts, exit code, env: %v) is not the crash-looping one:\n%s", w, st, logs)
			}
		}
		c.run("up", "--detach", "--wait", "--wait-timeout", "300", "--scale", "worker=4")
	})

	c.step("unreadable kubeconfig: a clear failure", func() {
		// A file only its owner (root) may read, as a checkout made under
		// umask 077 leaves deploy/compose/kubeconfig; matbus runs as 65532.
		kc := filepath.Join(t.TempDir(), "kubeconfig")
		b, err := os.ReadFile(filepath.Join(c.root, "deploy", "compose", "kubeconfig"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(kc, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Dir(kc), 0o755); err != nil {
			t.Fatal(err)
		}
		out, code := c.tryDocker("run", "--rm", "-v", kc+":/etc/matbus/kubeconfig:ro", c.image, "worker",
			"--kubeconfig", "/etc/matbus/kubeconfig", "--nats-url", "nats://127.0.0.1:1")
		if code != 1 || !strings.Contains(out, "is not readable by this process (uid 65532") || !strings.Contains(out, "chmod a+r deploy/compose/*") {
			t.Fatalf("worker with an unreadable kubeconfig: exit %d, want 1 with a message naming uid and the fix:\n%s", code, out)
		}
		t.Logf("%s", strings.TrimSpace(out))
	})

	c.step("down -v leaves nothing", func() {
		c.run("down", "--volumes", "--timeout", "30")
		c.down = true
		label := "label=com.docker.compose.project=" + project
		for _, what := range [][]string{
			{"ps", "--all", "--quiet", "--filter", label},
			{"network", "ls", "--quiet", "--filter", label},
			{"volume", "ls", "--quiet", "--filter", label},
			{"volume", "ls", "--quiet"},
		} {
			if out := strings.TrimSpace(c.docker(what...)); out != "" {
				t.Errorf("after down -v, `docker %s` lists:\n%s", strings.Join(what, " "), out)
			}
		}
	})
	c.summary()
}

// compose runs docker compose (and docker) in the repository root with the
// host ports moved to free ones.
type compose struct {
	t     *testing.T
	root  string
	env   []string
	image string // the matbus image
	port  map[string]string
	down  bool
	times []string
}

func newCompose(t *testing.T) *compose {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	c := &compose{t: t, root: root, port: map[string]string{}}
	c.env = os.Environ()
	for _, v := range []string{"MATBUS_NATS_PORT", "MATBUS_NATS_MONITOR_PORT", "MATBUS_KUBE_API_PORT"} {
		c.port[v] = freePort(t)
		c.env = append(c.env, v+"="+c.port[v])
	}
	c.image = strings.TrimSpace(c.run("config", "--images", "matbus-image"))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- docker compose ps -a\n%s", c.tryRun("ps", "--all"))
			t.Logf("--- docker compose logs (last 100 lines per service)\n%s", c.tryRun("logs", "--no-color", "--timestamps", "--tail", "100"))
		}
		if !c.down {
			c.tryRun("down", "--volumes", "--timeout", "10")
		}
	})
	return c
}

func (c *compose) step(name string, f func()) {
	c.t.Helper()
	start := time.Now()
	c.t.Logf("=== %s", name)
	f()
	c.times = append(c.times, fmt.Sprintf("%-55s %6.1fs", name, time.Since(start).Seconds()))
}

func (c *compose) summary() {
	c.t.Logf("step times:\n  %s", strings.Join(c.times, "\n  "))
}

func (c *compose) cmd(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = c.root, c.env
	return cmd
}

// run runs `docker compose <args>` and returns its standard output; it fails
// the test on an error.
func (c *compose) run(args ...string) string {
	c.t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := c.cmd("docker", append([]string{"compose"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("docker compose %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

func (c *compose) tryRun(args ...string) string {
	out, _ := c.cmd("docker", append([]string{"compose"}, args...)...).CombinedOutput()
	return string(out)
}

func (c *compose) docker(args ...string) string {
	c.t.Helper()
	out, err := c.cmd("docker", args...).Output()
	if err != nil {
		c.t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// tryCompose returns the combined output and exit code of docker compose <args>.
func (c *compose) tryCompose(args ...string) (string, int) {
	c.t.Helper()
	return c.tryDocker(append([]string{"compose"}, args...)...)
}

// tryDocker returns the combined output and exit code of docker <args>.
func (c *compose) tryDocker(args ...string) (string, int) {
	out, err := c.cmd("docker", args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		c.t.Fatalf("docker %s: %v", strings.Join(args, " "), err)
	}
	return string(out), 0
}

// curl runs curl with args in the curl service's image on the compose
// network and returns its standard output.
func (c *compose) curl(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := c.cmd("docker", append([]string{"compose", "run", "--rm", "--no-deps", "-T", curlSvc}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("curl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// containers returns the names of a service's containers.
func (c *compose) containers(service string) []string {
	c.t.Helper()
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(c.run("ps", "--format", "{{.Name}}", service)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// kube is a client of the compose kube-apiserver on its published port,
// with deploy/compose/kubeconfig.host's credentials.
func (c *compose) kube() kubernetes.Interface {
	c.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(c.root, "deploy", "compose", "kubeconfig.host"))
	if err != nil {
		c.t.Fatal(err)
	}
	cfg.Host = "https://" + net.JoinHostPort("127.0.0.1", c.port["MATBUS_KUBE_API_PORT"])
	return kubernetes.NewForConfigOrDie(cfg)
}

// bmcIPs returns the BMC IPs a simulator reports (hosts, DPUs, switches,
// power shelves; only devices with a BMC IP get a Service).
func (c *compose) bmcIPs(url string) map[string]bool {
	c.t.Helper()
	body, err := c.curl("--silent", "--show-error", "--fail", "--insecure", "--max-time", "10", url+"/machines/status")
	if err != nil {
		c.t.Fatal(err)
	}
	st, err := matclient.Decode([]byte(body))
	if err != nil {
		c.t.Fatalf("status of %s: %v", url, err)
	}
	ips := map[string]bool{}
	var walk func([]matclient.Device)
	walk = func(ds []matclient.Device) {
		for _, d := range ds {
			if d.BMC.IP != "" {
				ips[d.BMC.IP] = true
			}
			walk(d.DPUs)
		}
	}
	walk(st.Machines)
	if len(ips) == 0 {
		c.t.Fatalf("%s reports no BMC", url)
	}
	return ips
}

var syncsRe = regexp.MustCompile(`(?m)^matbus_worker_syncs(?:_unchanged)?_total (\d+)`)

// syncJobs returns how many sync jobs a worker container completed, from
// its /metrics (0 when it cannot be read yet).
func (c *compose) syncJobs(container string) int {
	out, err := c.curl("--silent", "--fail", "--max-time", "5", "http://"+container+":8080/metrics")
	if err != nil {
		c.t.Logf("metrics of %s: %v", container, err)
		return 0
	}
	n := 0
	for _, m := range syncsRe.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// bmcServices lists matbus's BMC Services (not the switches' NVOS ones).
func bmcServices(ctx context.Context, kube kubernetes.Interface, selector string) ([]corev1.Service, error) {
	sel := plan.LabelManagedBy + "=" + plan.DefaultManagedBy + "," + plan.LabelMachineType + "!=" + string(plan.MachineTypeNVOS)
	if selector != "" {
		sel += "," + selector
	}
	l, err := kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// serviceIPs returns each instance's BMC Services' cluster IPs.
func serviceIPs(ctx context.Context, kube kubernetes.Interface) (map[string]map[string]bool, error) {
	svcs, err := bmcServices(ctx, kube, "")
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]bool{}
	for _, s := range svcs {
		inst := s.Labels[plan.LabelInstance]
		if out[inst] == nil {
			out[inst] = map[string]bool{}
		}
		out[inst][s.Spec.ClusterIP] = true
	}
	return out, nil
}

func services(ctx context.Context, kube kubernetes.Interface, instance string) ([]corev1.Service, error) {
	svcs, err := bmcServices(ctx, kube, plan.LabelInstance+"="+plan.LabelValue(instance))
	slices.SortFunc(svcs, func(a, b corev1.Service) int { return strings.Compare(a.Name, b.Name) })
	return svcs, err
}

func equalUIDs(a, b []corev1.Service) bool {
	return slices.EqualFunc(a, b, func(x, y corev1.Service) bool { return x.Name == y.Name && x.UID == y.UID })
}

// waitFor polls cond every 2s until it holds, or fails the test after d
// with cond's last word.
func waitFor(t *testing.T, ctx context.Context, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not after %s: %s", what, d, why)
		}
		time.Sleep(2 * time.Second)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}
