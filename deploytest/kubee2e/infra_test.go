package kubee2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
)

// createFillers creates n headless Services without a selector (no cluster
// IP, no endpoints, no kube-proxy rules) with `workers` creates in flight.
func (e *e2e) createFillers(n, workers int) error {
	idx := make(chan int)
	var failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	for range workers {
		wg.Go(func() {
			for i := range idx {
				svc := &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("filler-%05d", i), Labels: map[string]string{labelFiller: "true"}},
					Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone},
				}
				var err error
				for attempt := range 3 {
					if _, err = e.kube.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err == nil || apierrors.IsAlreadyExists(err) {
						err = nil
						break
					}
					if ctx.Err() != nil || !(apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err)) {
						break
					}
					time.Sleep(time.Duration(attempt+1) * time.Second)
				}
				if err != nil {
					failed.Add(1)
					once.Do(func() { firstErr = fmt.Errorf("create Service %s: %w", svc.Name, err); cancel() })
				}
			}
		})
	}
	start := time.Now()
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		idx <- i
		if (i+1)%2500 == 0 {
			e.t.Logf("  %d Services created (%.0f/s)", i+1, float64(i+1)/time.Since(start).Seconds())
		}
	}
	close(idx)
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("%d creates failed, the first: %w", failed.Load(), firstErr)
	}
	return nil
}

// mat is one MAT instance as the MAT chart deploys it: a Deployment
// <name> whose pods carry app.kubernetes.io/name=nico-machine-a-tron and
// nvidia-infra-controller/pod-name=<name>, and the Service <name>-bmc-mock
// labelled nvidia-infra-controller/mat-service=true and pod-name=<name>,
// port `redfish` 1266 (HTTPS).
//
// A Deployment, not a StatefulSet or bare Pod: the old controller's own
// output (/work/shared/fixtures/old-controller: instance mat-2-bmc-mock,
// pod-name label mat-2, owner Deployment mat-2) shows that the MAT chart's
// pod-name label carries the Deployment's name, a fixed value a pod
// template can hold, and that the BMC Services are owned by the MAT
// Deployment. matbus resolves exactly that (worker.owner reads
// apps/v1 Deployments named after the Service without -bmc-mock; the
// chart's Role allows `get` on deployments only): with a StatefulSet the
// BMC Services would get no owner reference and nothing would
// garbage-collect them.
type mat struct {
	name   string
	hosts  int
	seed   int64
	subnet netip.Prefix
	empty  bool // no devices at all (hosts, switches and power shelves 0)

	podIP    string
	deploy   types.UID // the Deployment's UID (the owner of its BMC Services)
	status   *matclient.Status
	want     plan.Desired // plan.Build of the status
	bmcs     int          // BMC Services of want (the rest are NVOS)
	services map[string]types.UID
}

func (m *mat) service() string { return m.name + "-bmc-mock" }

// key is the instance key matbus uses: <namespace>.<discovered Service>.
func (m *mat) key() string { return namespace + "." + m.service() }

// host is the name matbus's URL has and MAT's certificate must name
// (discovery's default --mat-host-mode dns).
func (m *mat) host() string { return m.service() + "." + namespace + ".svc.cluster.local" }

func (m *mat) podSelector() string { return plan.PodNameLabel + "=" + m.name }

const (
	matLabelName = "app.kubernetes.io/name"
	matAppName   = "nico-machine-a-tron" // the worker's default target selector value
	matPort      = 1266
	matCASecret  = "mat-ca"
)

// matsimArgs sizes a fleet: hosts with one DPU each, one switch (a BMC and
// an NVOS Service) and one power shelf: 2*hosts+3 Services.
func (m *mat) args() []string {
	others := "1"
	if m.empty {
		others = "0"
	}
	args := []string{"matsim", "--listen", "0.0.0.0:" + strconv.Itoa(matPort), "--tls",
		"--tls-cert-file", "/etc/matsim/tls/tls.crt", "--tls-key-file", "/etc/matsim/tls/tls.key",
		"--hosts", strconv.Itoa(m.hosts), "--dpus-per-host", "1", "--switches", others, "--power-shelves", others,
		"--seed", strconv.FormatInt(m.seed, 10)}
	if m.subnet.IsValid() {
		args = append(args, "--bmc-subnet", m.subnet.String())
	}
	return args
}

// nvosMirror is where matsim puts the switches' NVOS IPs for a BMC subnet:
// 10.98.x.y for the BMC IP's low 16 bits x.y (matsim.Generate).
func nvosMirror(p netip.Prefix) netip.Prefix {
	a := p.Addr().As4()
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 98, a[2], a[3]}), p.Bits())
}

// chooseSubnets gives each MAT a /20 of the service range, away from its
// first /24 (where fixed cluster IPs such as the DNS Service's live), that
// holds no cluster IP of any Service of the cluster, nor does its NVOS
// mirror: the API server allocates other Services' IPs at random over the
// whole range, and each BMC IP must be free to become a Service's
// spec.clusterIP.
func (e *e2e) chooseSubnets() {
	e.t.Helper()
	all, err := e.kube.CoreV1().Services("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var taken []netip.Addr
	for _, s := range all.Items {
		for _, ip := range s.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				taken = append(taken, a)
			}
		}
	}
	free := func(p netip.Prefix) bool {
		if !e.cfg.serviceCIDR.Contains(p.Addr()) || p.Bits() < e.cfg.serviceCIDR.Bits() {
			return false
		}
		for _, a := range taken {
			if p.Contains(a) {
				return false
			}
		}
		return true
	}
	next := 0
	for _, m := range e.mats {
		for ; ; next++ {
			// 10.96.64.0/20, 10.96.80.0/20, … (the compose file's and dev's first subnets).
			third := 64 + 16*next
			if third > 240 {
				e.t.Fatalf("no free /20 for %s's BMCs in 10.96.64.0-10.96.255.255 (service range %s, cluster IPs in use %v)",
					m.name, e.cfg.serviceCIDR, taken)
			}
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 96, byte(third), 0}), 20)
			if free(p) && free(nvosMirror(p)) {
				m.subnet = p
				next++
				break
			}
			e.t.Logf("BMC subnet %s (NVOS %s) is not free in the service range %s: next", p, nvosMirror(p), e.cfg.serviceCIDR)
		}
	}
}

// createMATCerts makes the MAT CA (as cert-manager's CA issuer would be)
// and a serving certificate per instance for the name matbus connects to;
// the CA goes into the Secret the chart's worker.matCA names.
func (e *e2e) createMATCerts() {
	e.t.Helper()
	secrets := e.kube.CoreV1().Secrets(namespace)
	if _, err := secrets.Create(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: matCASecret},
		Data: map[string][]byte{"ca.crt": e.ca.PEM}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	for _, m := range e.mats {
		e.createMATCert(m)
	}
}

// createMATCert makes m's serving certificate (Secret <name>-tls).
func (e *e2e) createMATCert(m *mat) {
	e.t.Helper()
	certFile, keyFile := e.ca.WriteKeyPair(e.ca.Issue(m.host(), m.service()+"."+namespace+".svc", m.service()))
	crt, err := os.ReadFile(certFile)
	if err != nil {
		e.t.Fatal(err)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.kube.CoreV1().Secrets(namespace).Create(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: m.name + "-tls"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": e.ca.PEM}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// Pod and container security of the test's own workloads, as the chart's.
func podSecurity() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532),
		FSGroup: ptr.To[int64](65532), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
}

func containerSecurity() *corev1.SecurityContext {
	return &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
}

func requests(cpu, mem string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}
}

// createNATS runs NATS with JetStream as one pod (a Deployment of 1 with
// strategy Recreate, the store on an emptyDir: a restart loses the streams,
// as a single in-memory or emptyDir NATS does) and the Service nats
// (client 4222, monitoring 8222).
func (e *e2e) createNATS() {
	e.t.Helper()
	labels := map[string]string{"app.kubernetes.io/name": "nats"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "nats", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					EnableServiceLinks:            ptr.To(false),
					SecurityContext:               podSecurity(),
					TerminationGracePeriodSeconds: ptr.To[int64](10),
					Containers: []corev1.Container{{
						Name:            "nats",
						Image:           e.cfg.natsImage,
						ImagePullPolicy: corev1.PullNever,
						// Flags only: the image's entrypoint is nats-server (or the
						// upstream docker-entrypoint.sh, which runs it with flags alone).
						Args:  []string{"-js", "-sd", "/data", "-p", "4222", "-m", "8222"},
						Ports: []corev1.ContainerPort{{Name: "client", ContainerPort: 4222}, {Name: "monitor", ContainerPort: 8222}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz?js-enabled-only=true", Port: intstr.FromString("monitor")}},
							PeriodSeconds: 2, FailureThreshold: 3, TimeoutSeconds: 2,
						},
						VolumeMounts:    []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
						SecurityContext: containerSecurity(),
						Resources:       requests("20m", "32Mi"),
					}},
					Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
			},
		},
	}
	if _, err := e.kube.AppsV1().Deployments(namespace).Create(e.ctx, d, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "nats", Labels: labels},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{
			{Name: "client", Port: 4222, TargetPort: intstr.FromString("client")},
			{Name: "monitor", Port: 8222, TargetPort: intstr.FromString("monitor")},
		}},
	}
	if _, err := e.kube.CoreV1().Services(namespace).Create(e.ctx, svc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// createMATService creates m's Service (see mat). It comes before the
// Deployment, so that its cluster IP is known when the BMC subnets are chosen.
func (e *e2e) createMATService(m *mat) {
	e.t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: m.service(), Labels: map[string]string{
			"nvidia-infra-controller/mat-service": "true", plan.PodNameLabel: m.name, matLabelName: matAppName}},
		Spec: corev1.ServiceSpec{Selector: m.podLabels(), Ports: []corev1.ServicePort{
			{Name: "redfish", Port: matPort, TargetPort: intstr.FromString("redfish"), Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := e.kube.CoreV1().Services(namespace).Create(e.ctx, svc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (m *mat) podLabels() map[string]string {
	return map[string]string{matLabelName: matAppName, plan.PodNameLabel: m.name}
}

// createMATDeployment creates m's Deployment (see mat), serving HTTPS with
// the certificate of createMATCerts.
func (e *e2e) createMATDeployment(m *mat) {
	e.t.Helper()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: m.name, Labels: m.podLabels()},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: m.podLabels()},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: m.podLabels()},
				Spec: corev1.PodSpec{
					// Thousands of Services with cluster IPs share the namespace.
					EnableServiceLinks:            ptr.To(false),
					SecurityContext:               podSecurity(),
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers: []corev1.Container{{
						Name:            "matsim",
						Image:           e.cfg.image,
						ImagePullPolicy: corev1.PullNever,
						Args:            m.args(),
						Ports:           []corev1.ContainerPort{{Name: "redfish", ContainerPort: matPort}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("redfish"), Scheme: corev1.URISchemeHTTPS}},
							PeriodSeconds: 2, FailureThreshold: 3, TimeoutSeconds: 2,
						},
						VolumeMounts:    []corev1.VolumeMount{{Name: "tls", MountPath: "/etc/matsim/tls", ReadOnly: true}},
						SecurityContext: containerSecurity(),
						Resources:       requests("20m", "32Mi"),
					}},
					Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
						SecretName: m.name + "-tls", DefaultMode: ptr.To[int32](0o440)}}}},
				},
			},
		},
	}
	created, err := e.kube.AppsV1().Deployments(namespace).Create(e.ctx, d, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	m.deploy = created.UID
}

// fetchStatus reads m's status from its pod as the worker does: HTTPS to
// the Service's DNS name (dialled at the pod IP), verified against the MAT
// CA only, decoded by matclient.
func (e *e2e) fetchStatus(m *mat) error {
	return fetchAt(e, m, fmt.Sprintf("%s:%d", m.podIP, matPort))
}

func fetchAt(e *e2e, m *mat, dial string) error {
	addr := fmt.Sprintf("%s:%d", m.host(), matPort)
	c, err := matclient.New("https://"+addr, matclient.Config{RootCAs: e.ca.Pool(), Timeout: 30 * time.Second,
		DialContext: testenv.DialRoutes(map[string]string{addr: dial})})
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := c.Status(e.ctx)
	if err != nil {
		return err
	}
	if len(st.Invalid) > 0 {
		return fmt.Errorf("status has %d invalid devices, the first: %s", len(st.Invalid), st.Invalid[0])
	}
	m.status = st
	return nil
}
