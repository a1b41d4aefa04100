package devenv

import (
	"context"
	"fmt"
	"io"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/plan"
)

// watchServices prints our Services as they are created, changed and
// deleted, and returns a function counting those of instances (by their
// instance label), so Services of other pipelines in the namespace are not
// counted. Its informer stops when ctx ends (wg waits for that).
func watchServices(ctx context.Context, kube kubernetes.Interface, ns, managedBy string, instances map[string]bool, out io.Writer, wg *sync.WaitGroup) func() int {
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{plan.LabelManagedBy: managedBy}.String()
		}))
	inf := f.Core().V1().Services()
	line := func(op string, s *corev1.Service) {
		ip := s.Spec.ClusterIP
		if len(s.Spec.ExternalIPs) > 0 {
			ip = "external " + s.Spec.ExternalIPs[0]
		}
		fmt.Fprintf(out, "%s service %-42s %-11s %-16s %s\n", op, s.Name, s.Labels[plan.LabelDeviceKind], ip, s.Labels[plan.LabelInstance])
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if s, ok := o.(*corev1.Service); ok {
				line("+", s)
			}
		},
		UpdateFunc: func(a, b any) {
			x, ok1 := a.(*corev1.Service)
			y, ok2 := b.(*corev1.Service)
			if ok1 && ok2 && x.ResourceVersion != y.ResourceVersion {
				line("~", y)
			}
		},
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if s, ok := o.(*corev1.Service); ok {
				line("-", s)
			}
		},
	})
	lister := inf.Lister()
	f.Start(ctx.Done())
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		f.Shutdown()
	}()
	return func() int {
		if !inf.Informer().HasSynced() {
			return 0
		}
		l, _ := lister.Services(ns).List(labels.Everything())
		n := 0
		for _, s := range l {
			if instances[s.Labels[plan.LabelInstance]] {
				n++
			}
		}
		return n
	}
}
