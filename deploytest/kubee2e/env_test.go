package kubee2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/matbus/matbus/internal/testenv"
)

// The names the scenario uses. The release name holds the chart's name, so
// the chart's fullname is the release name (templates/_helpers.tpl) and the
// objects are matbus-discovery, matbus-worker, matbus-metrics, …
const (
	namespace = "matbus-e2e"
	release   = "matbus"
	fullname  = release
	leaseName = fullname + "-discovery" // matbus.leaseName with the default value
	chartDir  = "deploy/helm/matbus"

	// labelFiller marks the Services of step 1.
	labelFiller = "matbus-e2e/filler"
	// instanceSel selects every pod and object the chart labels.
	instanceSel  = "app.kubernetes.io/instance=" + release
	workerSel    = instanceSel + ",app.kubernetes.io/component=worker"
	discoverySel = instanceSel + ",app.kubernetes.io/component=discovery"
)

// config is what hack/kube-e2e.sh passes in the environment.
type config struct {
	kubeconfig  string
	image       string // the matbus image, also the MAT simulator's
	natsImage   string
	gateway     string // the stand-in of the MAT protocol gateway (deploytest/gatewaystandin)
	serviceCIDR netip.Prefix
	helm        string
	root        string // the repository root
	keep        bool   // MATBUS_KUBE_E2E_KEEP=1: leave the namespace for a look afterwards
}

func loadConfig(t *testing.T) config {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	c := config{
		kubeconfig: os.Getenv("KUBECONFIG"),
		image:      os.Getenv("MATBUS_KUBE_E2E_IMAGE"),
		natsImage:  os.Getenv("MATBUS_KUBE_E2E_NATS_IMAGE"),
		gateway:    os.Getenv("MATBUS_KUBE_E2E_GATEWAY_IMAGE"),
		root:       root,
		keep:       os.Getenv("MATBUS_KUBE_E2E_KEEP") == "1",
	}
	var missing []string
	for name, v := range map[string]string{"KUBECONFIG": c.kubeconfig, "MATBUS_KUBE_E2E_IMAGE": c.image, "MATBUS_KUBE_E2E_NATS_IMAGE": c.natsImage, "MATBUS_KUBE_E2E_GATEWAY_IMAGE": c.gateway} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Fatalf("MATBUS_KUBE_E2E=1 needs %s (hack/kube-e2e.sh sets them)", strings.Join(missing, ", "))
	}
	cidr := os.Getenv("MATBUS_KUBE_E2E_SERVICE_CIDR")
	if cidr == "" {
		cidr = "10.96.0.0/12"
	}
	if c.serviceCIDR, err = netip.ParsePrefix(cidr); err != nil || !c.serviceCIDR.Addr().Is4() {
		t.Fatalf("MATBUS_KUBE_E2E_SERVICE_CIDR %q: want an IPv4 CIDR (%v)", cidr, err)
	}
	c.serviceCIDR = c.serviceCIDR.Masked()
	bin := os.Getenv("MATBUS_BIN_DIR")
	if bin == "" {
		bin = filepath.Join(root, ".bin")
	}
	c.helm = filepath.Join(bin, "helm")
	if _, err := os.Stat(c.helm); err != nil {
		t.Fatalf("helm: %v (make tools builds it into .bin/; MATBUS_BIN_DIR overrides the folder)", err)
	}
	return c
}

// splitImage splits "repo:tag" or "repo@sha256:…" into the chart's
// image.repository and image.tag or image.digest.
func splitImage(ref string) (repo, tag, digest string) {
	if i := strings.Index(ref, "@"); i >= 0 {
		return ref[:i], "", ref[i+1:]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:], ""
	}
	return ref, "", ""
}

// e2e is one run of the scenario: the cluster, what the steps found, and
// the step times.
type e2e struct {
	t    *testing.T
	ctx  context.Context
	cfg  config
	kube kubernetes.Interface

	ca    *testenv.CA
	mats  []*mat // big, small
	rec   *svcRecorder
	steps []stepTime
	// gw: each discovery pod's gateway container after the last step
	// (restart count, last exit); bigGone: when step 4 deleted mat-big's
	// Service (a change of the gateway's sources).
	gw      map[string]gatewayPod
	bigGone time.Time
}

type stepTime struct {
	name string
	took time.Duration
	note string
}

func newE2E(t *testing.T, ctx context.Context) *e2e {
	t.Helper()
	cfg := loadConfig(t)
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", cfg.kubeconfig, err)
	}
	// Thousands of objects are created and listed: client-go's default of
	// 5 QPS would make this test about the client's rate limiter.
	rc.QPS, rc.Burst = 300, 600
	rc.Timeout = 2 * time.Minute
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	v, err := kube.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("API server of %s: %v", cfg.kubeconfig, err)
	}
	t.Logf("cluster: Kubernetes %s; matbus image %s, NATS image %s, service range %s", v.GitVersion, cfg.image, cfg.natsImage, cfg.serviceCIDR)
	return &e2e{t: t, ctx: ctx, cfg: cfg, kube: kube}
}

// step runs f as one step of the scenario and records its time and the
// measurements f returns for the summary.
func (e *e2e) step(name string, f func() string) {
	e.t.Helper()
	start := time.Now()
	e.t.Logf("=== step %s", name)
	note := f()
	took := time.Since(start)
	e.steps = append(e.steps, stepTime{name, took, note})
	e.t.Logf("=== step %s: done in %.1fs%s", name, took.Seconds(), prefixed(": ", note))
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// summary logs the step table (also after a failure: the steps that ran).
func (e *e2e) summary() {
	var b strings.Builder
	w := 0
	for _, s := range e.steps {
		w = max(w, len(s.name))
	}
	fmt.Fprintf(&b, "%-*s  %8s  %s\n", w, "step", "time", "measured")
	var total time.Duration
	for _, s := range e.steps {
		total += s.took
		fmt.Fprintf(&b, "%-*s  %7.1fs  %s\n", w, s.name, s.took.Seconds(), s.note)
	}
	fmt.Fprintf(&b, "%-*s  %7.1fs", w, "total", total.Seconds())
	e.t.Logf("step times:\n%s", b.String())
}

// helm runs the helm binary in the repository root and returns its
// combined output; it fails the test on an error.
func (e *e2e) helm(timeout time.Duration, args ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.cfg.helm, args...)
	cmd.Dir = e.cfg.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.cfg.kubeconfig)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		e.t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// waitFor polls cond every `every` until it holds, or fails the test after
// d with what and cond's last word. It returns how long it took. (For
// cheap conditions the scenario uses testenv.Wait, which polls every
// 50 ms; the listings of thousands of objects here are polled slower.)
func (e *e2e) waitFor(d, every time.Duration, what string, cond func() (bool, string)) time.Duration {
	e.t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	for {
		ok, why := cond()
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) || e.ctx.Err() != nil {
			e.t.Fatalf("%s: not after %v: %s", what, d, why)
		}
		select {
		case <-e.ctx.Done():
		case <-time.After(every):
		}
	}
}

// pods lists the namespace's pods matching selector.
func (e *e2e) pods(selector string) ([]corev1.Pod, error) {
	l, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(l.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return l.Items, nil
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podLine is a one-line state of a pod for messages and the dump.
func podLine(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s ready=%v ip=%s", p.Name, p.Status.Phase, podReady(p), p.Status.PodIP)
	if p.DeletionTimestamp != nil {
		b.WriteString(" terminating")
	}
	for _, c := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, " [%s restarts=%d", c.Name, c.RestartCount)
		if w := c.State.Waiting; w != nil {
			fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
		}
		if x := c.State.Terminated; x != nil {
			fmt.Fprintf(&b, " terminated %s exit %d", x.Reason, x.ExitCode)
		}
		if x := c.LastTerminationState.Terminated; x != nil {
			fmt.Fprintf(&b, " last %s exit %d", x.Reason, x.ExitCode)
		}
		b.WriteString("]")
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			fmt.Fprintf(&b, " %s=%s: %s", c.Type, c.Status, c.Message)
		}
	}
	return b.String()
}

func podLines(ps []corev1.Pod) string {
	var out []string
	for i := range ps {
		out = append(out, podLine(&ps[i]))
	}
	if len(out) == 0 {
		return "(none)"
	}
	return strings.Join(out, "; ")
}

// waitPodsReady waits until exactly n pods match selector and all are ready.
func (e *e2e) waitPodsReady(selector string, n int, d time.Duration) []corev1.Pod {
	e.t.Helper()
	var ready []corev1.Pod
	e.waitFor(d, time.Second, fmt.Sprintf("%d ready pods %s", n, selector), func() (bool, string) {
		ps, err := e.pods(selector)
		if err != nil {
			return false, err.Error()
		}
		ready = ready[:0]
		for i := range ps {
			if podReady(&ps[i]) {
				ready = append(ready, ps[i])
			}
		}
		return len(ps) == n && len(ready) == n, podLines(ps)
	})
	return ready
}

// dump logs what helps after a failure: every pod's state, the
// namespace's latest Kubernetes Events and the last 50 log lines of every
// container of the matbus, NATS and MAT pods. It uses its own context: the
// test's is over when cleanups run.
func dump(t *testing.T, kube kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods, err := kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("--- dump: pods: %v", err)
		return
	}
	var b strings.Builder
	for i := range pods.Items {
		fmt.Fprintf(&b, "  %s\n", podLine(&pods.Items[i]))
	}
	t.Logf("--- pods of %s:\n%s", namespace, b.String())

	if evs, err := kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{}); err != nil {
		t.Logf("--- events: %v", err)
	} else {
		items := evs.Items
		when := func(e corev1.Event) time.Time {
			for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time, e.CreationTimestamp.Time} {
				if !t.IsZero() {
					return t
				}
			}
			return time.Time{}
		}
		slices.SortFunc(items, func(a, b corev1.Event) int { return when(a).Compare(when(b)) })
		if len(items) > 60 {
			items = items[len(items)-60:]
		}
		b.Reset()
		for _, ev := range items {
			fmt.Fprintf(&b, "  %s %s %s/%s %s (x%d): %s\n", when(ev).Format(time.TimeOnly), ev.Type, ev.InvolvedObject.Kind,
				ev.InvolvedObject.Name, ev.Reason, max(ev.Count, 1), ev.Message)
		}
		t.Logf("--- last %d events of %s:\n%s", len(items), namespace, b.String())
	}

	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			t.Logf("--- logs of %s/%s (last 50 lines):\n%s", p.Name, c.Name, podLogs(ctx, kube, p.Name, c.Name, false, 50))
			if c.RestartCount > 0 {
				t.Logf("--- logs of the previous %s/%s (last 50 lines):\n%s", p.Name, c.Name, podLogs(ctx, kube, p.Name, c.Name, true, 50))
			}
		}
	}
}

// podLogs returns the last lines of a container's log (pods/log).
func podLogs(ctx context.Context, kube kubernetes.Interface, pod, container string, previous bool, lines int64) string {
	rc, err := kube.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, Previous: previous, TailLines: &lines}).Stream(ctx)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 1<<20))
	if err != nil {
		return string(b) + "\n(" + err.Error() + ")"
	}
	return string(b)
}

// freshNamespace deletes a namespace an earlier run left and creates it anew.
func (e *e2e) freshNamespace() {
	e.t.Helper()
	nss := e.kube.CoreV1().Namespaces()
	if _, err := nss.Get(e.ctx, namespace, metav1.GetOptions{}); err == nil {
		e.t.Logf("namespace %s is left from an earlier run: deleting it", namespace)
		if err := nss.Delete(e.ctx, namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Fatal(err)
		}
		took := e.waitFor(5*time.Minute, 2*time.Second, "namespace "+namespace+" of an earlier run deleted", func() (bool, string) {
			ns, err := nss.Get(e.ctx, namespace, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, ""
			}
			if err != nil {
				return false, err.Error()
			}
			return false, fmt.Sprintf("phase %s, conditions %v", ns.Status.Phase, ns.Status.Conditions)
		})
		e.t.Logf("namespace of an earlier run deleted in %.1fs", took.Seconds())
	}
	if _, err := nss.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace,
		Labels: map[string]string{"app.kubernetes.io/part-of": "matbus-kube-e2e"}}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create namespace %s: %v", namespace, err)
	}
}

// deleteNamespace removes the namespace at the end (the API server deletes
// the Services with one deletecollection) and waits a bounded time for it.
func deleteNamespace(t *testing.T, kube kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	if err := kube.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("delete namespace %s: %v", namespace, err)
		return
	}
	for ctx.Err() == nil {
		if _, err := kube.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			t.Logf("namespace %s deleted in %.1fs", namespace, time.Since(start).Seconds())
			return
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("namespace %s still terminating after %v; a next run waits for it", namespace, time.Since(start).Round(time.Second))
}
