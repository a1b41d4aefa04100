package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// Issue point 5: errors are classified by HTTP status code and status
// causes, never by message text. These tests classify what the real API
// server answers, and constructed errors whose message and cause disagree.

var (
	serviceRange = netip.MustParsePrefix("10.96.0.0/12")
	withRange    = worker.Classifier{ServiceCIDRs: []netip.Prefix{serviceRange}}
	servicesGR   = schema.GroupResource{Resource: "services"}
)

// svcWithIP is a Service asking for cluster IP ip ("" lets the API server pick).
func svcWithIP(name, ip string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Name: "redfish", Port: 443}}}}
	if ip != "" {
		s.Spec.ClusterIPs = []string{ip}
	}
	return s
}

// invalid builds a 422 like the API server's, with one cause.
func invalid(name, field, msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422,
		Reason: metav1.StatusReasonInvalid, Message: msg,
		Details: &metav1.StatusDetails{Kind: "Service", Name: name,
			Causes: []metav1.StatusCause{{Type: metav1.CauseTypeFieldValueInvalid, Field: field, Message: msg}}}}}
}

func TestClassifyTable(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := context.Background()
	svc := svcWithIP("s", "10.96.5.5")
	outside := svcWithIP("s", "192.0.2.10")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		c    worker.Classifier
		err  error
		svc  *corev1.Service
		want worker.Class
	}{
		{"409 conflict", bg, withRange, apierrors.NewConflict(servicesGR, "s", errors.New("the object has been modified")), svc, worker.Transient},
		{"429", bg, withRange, apierrors.NewTooManyRequests("slow down", 1), svc, worker.Transient},
		{"500", bg, withRange, apierrors.NewInternalError(errors.New("etcd")), svc, worker.Transient},
		{"503", bg, withRange, apierrors.NewServiceUnavailable("down"), svc, worker.Transient},
		{"504 timeout", bg, withRange, apierrors.NewTimeoutError("slow", 1), svc, worker.Transient},
		{"transport error", bg, withRange, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, svc, worker.Transient},
		{"403", bg, withRange, apierrors.NewForbidden(servicesGR, "s", errors.New(`User "x" cannot create resource "services"`)), svc, worker.Permanent},
		{"401", bg, withRange, apierrors.NewUnauthorized("token expired"), svc, worker.Permanent},
		{"422 allocated, in range", bg, withRange, invalid("s", "spec.clusterIPs", "provided IP is already allocated"), svc, worker.Transient},
		{"422 allocated, range unknown", bg, worker.Classifier{}, invalid("s", "spec.clusterIPs", "provided IP is already allocated"), svc, worker.Transient},
		{"422 out of range", bg, withRange, invalid("s", "spec.clusterIPs", "not in the valid range"), outside, worker.Permanent},
		{"422 invalid name", bg, withRange, invalid("Bad_Name", "metadata.name", "a DNS-1035 label must consist of"), svc, worker.Permanent},
		// The message says "allocated", the cause says metadata.name: the cause decides.
		{"422 name cause with an allocation message", bg, withRange, invalid("s", "metadata.name", "provided IP is already allocated"), svc, worker.Permanent},
		// The cause names spec.clusterIPs with an unrelated message: the cause and the range decide.
		{"422 clusterIP cause with any message", bg, withRange, invalid("s", "spec.clusterIPs", "zzz"), svc, worker.Transient},
		{"context canceled", canceled, withRange, apierrors.NewInternalError(errors.New("x")), svc, worker.Canceled},
		{"context.Canceled wrapped", bg, withRange, fmt.Errorf("create: %w", context.Canceled), svc, worker.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, msg := tc.c.Classify(tc.ctx, tc.err, tc.svc)
			if got != tc.want {
				t.Errorf("Classify = %v (%s), want %v", got, msg, tc.want)
			}
			if msg == "" {
				t.Error("empty message")
			}
		})
	}
}

// TestClassifyRealAPIErrors provokes each error from the real API server
// and checks its class and message.
func TestClassifyRealAPIErrors(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := testenv.Namespace("t", t.Name())
	if _, err := adminKube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svcs := adminKube.CoreV1().Services(ns)
	t.Cleanup(func() {
		list, _ := svcs.List(context.Background(), metav1.ListOptions{})
		if list != nil {
			for _, s := range list.Items {
				_ = svcs.Delete(context.Background(), s.Name, metav1.DeleteOptions{})
			}
		}
		_ = adminKube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	cls := worker.Classifier{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix(c.ServiceCIDR)}}
	check := func(t *testing.T, err error, svc *corev1.Service, want worker.Class, wantCode int32, msgHas ...string) {
		t.Helper()
		if err == nil {
			t.Fatal("the API server accepted the request")
		}
		var st apierrors.APIStatus
		if !errors.As(err, &st) || st.Status().Code != wantCode {
			t.Errorf("want HTTP %d, got %v", wantCode, err)
		}
		got, msg := cls.Classify(ctx, err, svc)
		if got != want {
			t.Errorf("Classify(%v) = %v, want %v (%s)", err, got, want, msg)
		}
		for _, s := range msgHas {
			if !strings.Contains(msg, s) {
				t.Errorf("message %q does not say %q", msg, s)
			}
		}
	}
	// A clusterIP this test owns: 10.96.200.<random-ish>.
	ip := fmt.Sprintf("10.96.200.%d", 10+time.Now().Nanosecond()%200)

	t.Run("409 stale resourceVersion", func(t *testing.T) {
		s, err := svcs.Create(ctx, svcWithIP("conflict", ""), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s1 := s.DeepCopy()
		s1.Annotations = map[string]string{"a": "1"}
		if _, err := svcs.Update(ctx, s1, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		s2 := s.DeepCopy() // the old resourceVersion
		s2.Annotations = map[string]string{"a": "2"}
		_, err = svcs.Update(ctx, s2, metav1.UpdateOptions{})
		check(t, err, s2, worker.Transient, 409, "conflict")
	})
	t.Run("422 provided IP is already allocated", func(t *testing.T) {
		if _, err := svcs.Create(ctx, svcWithIP("holder", ip), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want := svcWithIP("wants-the-ip", ip)
		_, err := svcs.Create(ctx, want, metav1.CreateOptions{})
		check(t, err, want, worker.Transient, 422, ip, "allocated to another Service")
		// Without a known range the same answer is retried too.
		if got, _ := (worker.Classifier{}).Classify(ctx, err, want); got != worker.Transient {
			t.Errorf("range unknown: %v, want transient", got)
		}
	})
	t.Run("422 IP outside the service range", func(t *testing.T) {
		want := svcWithIP("outside", "192.0.2.10")
		_, err := svcs.Create(ctx, want, metav1.CreateOptions{})
		check(t, err, want, worker.Permanent, 422, "192.0.2.10", "outside the service range")
	})
	t.Run("422 invalid name", func(t *testing.T) {
		want := svcWithIP("Bad_Name", "")
		_, err := svcs.Create(ctx, want, metav1.CreateOptions{})
		check(t, err, want, worker.Permanent, 422, "invalid")
	})
	t.Run("403 missing RBAC permission", func(t *testing.T) {
		rc := rest.CopyConfig(c.RESTConfig())
		rc.Impersonate = rest.ImpersonationConfig{UserName: "matbus-without-rights"}
		kc, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		want := svcWithIP("forbidden", "")
		_, err = kc.CoreV1().Services(ns).Create(ctx, want, metav1.CreateOptions{})
		check(t, err, want, worker.Permanent, 403, "forbidden", "RBAC", `cannot create resource "services"`, "matbus-without-rights")
	})
	t.Run("context canceled", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		ccancel()
		_, err := svcs.Create(cctx, svcWithIP("canceled", ""), metav1.CreateOptions{})
		if err == nil {
			t.Fatal("created with a canceled context")
		}
		if got, _ := cls.Classify(cctx, err, nil); got != worker.Canceled {
			t.Errorf("Classify = %v, want canceled", got)
		}
	})
	t.Run("API server unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		kc, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + addr, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, err = kc.CoreV1().Services(ns).Get(ctx, "x", metav1.GetOptions{})
		if err == nil {
			t.Fatal("no error from a closed port")
		}
		if got, _ := cls.Classify(ctx, err, nil); got != worker.Transient {
			t.Errorf("Classify(%v) = %v, want transient", err, got)
		}
	})
}

// conflictOnce is a RoundTripper that, before the first PUT of a Service
// passes through it, changes that Service with the admin client: the PUT
// then carries a stale resourceVersion and the real API server answers 409.
type conflictOnce struct {
	next     http.RoundTripper
	ns       string
	injected atomic.Int32
}

func (c *conflictOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/namespaces/"+c.ns+"/services/") && c.injected.Add(1) == 1 {
		name := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
		s, err := adminKube.CoreV1().Services(c.ns).Get(req.Context(), name, metav1.GetOptions{})
		if err == nil {
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations["example.com/touched-by"] = "someone-else"
			_, err = adminKube.CoreV1().Services(c.ns).Update(req.Context(), s, metav1.UpdateOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("conflictOnce: %w", err)
		}
	}
	return c.next.RoundTrip(req)
}

// TestConflictIsRereadAndRetriedSilently: a worker's update that the API
// server refuses with 409 (someone else changed the Service in between) is
// retried after a fresh read, succeeds, publishes no error event, and keeps
// the other party's annotation.
func TestConflictIsRereadAndRetriedSilently(t *testing.T) {
	e := newEnv(t)
	fleet := generatedFleet(t, "10.96.96.0/24", 7)
	sim := e.startSim(matsim.Options{Fleet: fleet})
	e.startDiscovery(e.entry("mat-a", sim.URL()))
	inj := &conflictOnce{ns: e.ns}
	rc := rest.CopyConfig(cluster.RESTConfig())
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { inj.next = rt; return inj }
	// Power states are only written with state annotations on.
	w := e.startWorker(workerOpts{Rest: rc, Tweak: func(c *worker.Config) { c.Plan.StateAnnotations = true }})
	want := wantServiceNames(fleet)
	e.waitServices(want...)

	// Every device changes its power state: each Service needs an update.
	next := fleet.Clone()
	for i := range next.Machines {
		next.Machines[i].PowerState = "Off"
	}
	if err := sim.SetFleet(next); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every Service updated", func() (bool, string) {
		off := 0
		for _, s := range e.services() {
			if s.Annotations[plan.AnnotationPowerState] == "Off" {
				off++
			}
		}
		return off == len(next.Machines) && w.Stats().Updated >= int64(len(next.Machines)), fmt.Sprintf("%d updated, stats %+v", off, w.Stats())
	})
	if inj.injected.Load() == 0 {
		t.Fatal("no update went through the conflict injector")
	}
	touched := 0
	for _, s := range e.services() {
		if s.Annotations["example.com/touched-by"] == "someone-else" {
			touched++
		}
	}
	if touched != 1 {
		t.Errorf("%d Services keep the other party's annotation, want 1 (the conflicted one)", touched)
	}
	for _, k := range []string{"create", "update", "delete"} {
		if evs := e.errs.Of(errKind(k)); len(evs) != 0 {
			t.Errorf("error events of kind %s after a conflict: %+v", k, evs)
		}
	}
}
