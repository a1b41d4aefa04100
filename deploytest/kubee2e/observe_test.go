package kubee2e

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/plan"
)

// svcEvent is one Service created in or deleted from the namespace, as the
// API server's watch reports it.
type svcEvent struct {
	at       time.Time
	added    bool // else deleted
	name     string
	uid      types.UID
	instance string // matbus.io/instance label value
	filler   bool
}

// svcRecorder records every Service added to or deleted from the namespace
// after it started (an informer: a watch that lists again after an
// expired resource version, so no delete is missed).
type svcRecorder struct {
	mu  sync.Mutex
	evs []svcEvent
}

func (e *e2e) recordServices() *svcRecorder {
	e.t.Helper()
	r := &svcRecorder{}
	f := informers.NewSharedInformerFactoryWithOptions(e.kube, 0, informers.WithNamespace(namespace))
	inf := f.Core().V1().Services().Informer()
	rec := func(obj any, added bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s, ok := obj.(*corev1.Service)
		if !ok {
			return
		}
		r.mu.Lock()
		r.evs = append(r.evs, svcEvent{at: time.Now(), added: added, name: s.Name, uid: s.UID,
			instance: s.Labels[plan.LabelInstance], filler: s.Labels[labelFiller] == "true"})
		r.mu.Unlock()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if !initial {
				rec(obj, true)
			}
		},
		DeleteFunc: func(obj any) { rec(obj, false) },
	}); err != nil {
		e.t.Fatal(err)
	}
	stop := make(chan struct{})
	f.Start(stop)
	e.t.Cleanup(func() { close(stop); f.Shutdown() })
	if !cache.WaitForCacheSync(e.ctx.Done(), inf.HasSynced) {
		e.t.Fatal("the test's Service informer did not sync")
	}
	return r
}

// since returns the events from t0 on.
func (r *svcRecorder) since(t0 time.Time) (added, deleted []svcEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range r.evs {
		if ev.at.Before(t0) {
			continue
		}
		if ev.added {
			added = append(added, ev)
		} else {
			deleted = append(deleted, ev)
		}
	}
	return added, deleted
}

func names(evs []svcEvent, limit int) string {
	var out []string
	for _, ev := range evs {
		if len(out) == limit {
			out = append(out, fmt.Sprintf("… (%d in all)", len(evs)))
			break
		}
		out = append(out, fmt.Sprintf("%s (uid %s, instance %q)", ev.name, ev.uid, ev.instance))
	}
	return strings.Join(out, ", ")
}

// jobMsg is one job message the test saw on NATS.
type jobMsg struct {
	at  time.Time
	env events.Envelope
}

// jobRecorder subscribes (core NATS) to a job subject: every message
// published into the JetStream stream reaches plain subscribers too.
type jobRecorder struct {
	sub *nats.Subscription
	mu  sync.Mutex
	got []jobMsg
	bad []string
}

func (e *e2e) recordJobs(nc *nats.Conn, subject string) *jobRecorder {
	e.t.Helper()
	r := &jobRecorder{}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		env, err := events.Decode(m.Data)
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			r.bad = append(r.bad, fmt.Sprintf("%s: %v", m.Subject, err))
			return
		}
		r.got = append(r.got, jobMsg{at: time.Now(), env: env})
	})
	if err != nil {
		e.t.Fatalf("subscribe %s: %v", subject, err)
	}
	// The subscription is in place on the server once a round trip is done.
	if err := nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	r.sub = sub
	return r
}

func (r *jobRecorder) stop() { _ = r.sub.Unsubscribe() }

func (r *jobRecorder) messages() ([]jobMsg, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got), slices.Clone(r.bad)
}

// natsURL is the NATS Service's cluster IP: the host (the node) reaches
// cluster IPs through kube-proxy's rules like any pod.
func (e *e2e) natsURL() string {
	e.t.Helper()
	s, err := e.kube.CoreV1().Services(namespace).Get(e.ctx, "nats", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return "nats://" + s.Spec.ClusterIP + ":4222"
}

func (e *e2e) connectNATS() *nats.Conn {
	e.t.Helper()
	url := e.natsURL()
	nc, err := nats.Connect(url, nats.Name("matbus-kube-e2e"), nats.Timeout(5*time.Second), nats.MaxReconnects(-1))
	if err != nil {
		e.t.Fatalf("NATS at %s from the node: %v", url, err)
	}
	return nc
}

// readyz GETs a pod's /readyz on the chart's health port.
func readyz(podIP string) (int, string, error) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + podIP + ":8080/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// planOptions are the chart's worker settings as plan.Options: namespace,
// the old controller's managed-by and target selector, cluster-ip mode,
// state annotations on.
func planOptions() plan.Options {
	sel, err := labels.ConvertSelectorToLabelsMap(plan.DefaultTargetSelector)
	if err != nil {
		panic(err)
	}
	return plan.Options{Namespace: namespace, ManagedBy: plan.DefaultManagedBy, IPMode: plan.IPModeClusterIP,
		TargetSelector: sel, StateAnnotations: true}
}

// desired plans m's Services from its status with the project's own
// planner, as a worker does for the instance matbus discovers: the pod
// name from the Service's label, the owner the MAT Deployment.
func (m *mat) plan() {
	owner := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: m.name, UID: m.deploy}
	m.want = plan.Build(plan.Instance{Key: m.key(), PodName: m.name, Owner: owner}, m.status, planOptions())
	m.bmcs = 0
	for _, s := range m.want.Services {
		if s.Labels[plan.LabelDeviceKind] != string(plan.MachineTypeNVOS) {
			m.bmcs++
		}
	}
}

// existing lists m's Services (the worker's instance selector).
func (e *e2e) existing(m *mat) ([]*corev1.Service, error) {
	l, err := e.kube.CoreV1().Services(namespace).List(e.ctx, metav1.ListOptions{
		LabelSelector: plan.InstanceSelector(planOptions(), m.key()).String()})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Service, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out, nil
}

// converged says whether m's Services are exactly what plan.Build wants
// (plan.Diff finds nothing to create, update, recreate or delete), and
// records their UIDs when they are.
func (e *e2e) converged(m *mat) (bool, string) {
	have, err := e.existing(m)
	if err != nil {
		return false, err.Error()
	}
	p := plan.Diff(m.want, have, planOptions())
	if !p.Empty() || len(have) != len(m.want.Services) {
		var first []string
		for _, s := range p.Create {
			first = append(first, "create "+s.Name)
			if len(first) == 3 {
				break
			}
		}
		for _, u := range p.Update {
			first = append(first, "update "+u.New.Name)
			if len(first) == 6 {
				break
			}
		}
		for _, u := range p.Recreate {
			first = append(first, "recreate "+u.New.Name+": "+u.Reason)
		}
		for _, s := range p.Delete {
			first = append(first, "delete "+s.Name)
		}
		if len(first) > 10 {
			first = first[:10]
		}
		return false, fmt.Sprintf("%s: %d Services for %d wanted; plan.Diff: %d creates, %d updates, %d recreates, %d deletes (%s)",
			m.key(), len(have), len(m.want.Services), len(p.Create), len(p.Update), len(p.Recreate), len(p.Delete), strings.Join(first, "; "))
	}
	m.services = make(map[string]types.UID, len(have))
	for _, s := range have {
		m.services[s.Name] = s.UID
	}
	return true, ""
}

// endpointsRight says whether the EndpointSlices of every Service m wants
// list exactly m's pod IP (ready), never another pod's: the selector the
// worker wrote, through the real EndpointSlice controller.
func (e *e2e) endpointsRight(m *mat, slices map[string][]discoveryv1.EndpointSlice, other map[string]bool) (int, []string) {
	ok := 0
	var wrong []string
	for _, s := range m.want.Services {
		var ips []string
		for _, sl := range slices[s.Name] {
			for _, ep := range sl.Endpoints {
				if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					continue
				}
				ips = append(ips, ep.Addresses...)
			}
		}
		switch {
		case len(ips) == 1 && ips[0] == m.podIP:
			ok++
		case len(wrong) < 5:
			var note string
			for _, ip := range ips {
				if other[ip] {
					note = " (another MAT's pod!)"
				}
			}
			wrong = append(wrong, fmt.Sprintf("%s lists %v%s, want [%s]", s.Name, ips, note, m.podIP))
		}
	}
	return ok, wrong
}

// endpointSlices lists the namespace's EndpointSlices by Service name.
func (e *e2e) endpointSlices() (map[string][]discoveryv1.EndpointSlice, error) {
	l, err := e.kube.DiscoveryV1().EndpointSlices(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName})
	if err != nil {
		return nil, err
	}
	out := map[string][]discoveryv1.EndpointSlice{}
	for _, s := range l.Items {
		n := s.Labels[discoveryv1.LabelServiceName]
		out[n] = append(out[n], s)
	}
	return out, nil
}

// rolledOut says whether a Deployment's rollout is complete, as `kubectl
// rollout status` decides, and that every pod is of the newest ReplicaSet
// and ready.
func (e *e2e) rolledOut(name string) (bool, string) {
	d, err := e.kube.AppsV1().Deployments(namespace).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	st := d.Status
	switch {
	case d.Generation > st.ObservedGeneration:
		return false, fmt.Sprintf("generation %d not observed (%d)", d.Generation, st.ObservedGeneration)
	case st.UpdatedReplicas < want:
		return false, fmt.Sprintf("%d of %d replicas updated", st.UpdatedReplicas, want)
	case st.Replicas > st.UpdatedReplicas:
		return false, fmt.Sprintf("%d old replicas pending termination", st.Replicas-st.UpdatedReplicas)
	case st.AvailableReplicas < st.UpdatedReplicas:
		return false, fmt.Sprintf("%d of %d updated replicas available", st.AvailableReplicas, st.UpdatedReplicas)
	}
	rs, err := e.newestReplicaSet(d)
	if err != nil {
		return false, err.Error()
	}
	ps, err := e.pods(labels.SelectorFromSet(d.Spec.Selector.MatchLabels).String())
	if err != nil {
		return false, err.Error()
	}
	ready := 0
	for i := range ps {
		p := &ps[i]
		if p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey] {
			return false, fmt.Sprintf("pod %s of an older ReplicaSet is still there", p.Name)
		}
		if podReady(p) {
			ready++
		}
	}
	if ready != int(want) || len(ps) != int(want) {
		return false, fmt.Sprintf("%d of %d pods of ReplicaSet %s ready: %s", ready, want, rs.Name, podLines(ps))
	}
	return true, ""
}

// newestReplicaSet is the ReplicaSet of the Deployment's current revision.
func (e *e2e) newestReplicaSet(d *appsv1.Deployment) (*appsv1.ReplicaSet, error) {
	const rev = "deployment.kubernetes.io/revision"
	l, err := e.kube.AppsV1().ReplicaSets(namespace).List(e.ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(d.Spec.Selector.MatchLabels).String()})
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		if l.Items[i].Annotations[rev] == d.Annotations[rev] {
			return &l.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no ReplicaSet of %s has revision %s", d.Name, d.Annotations[rev])
}

func revision(d *appsv1.Deployment) int {
	n, _ := strconv.Atoi(d.Annotations["deployment.kubernetes.io/revision"])
	return n
}
