package kubewatch

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ServiceInformer registers with factory the Service informer that t
// observes and returns it: its list and watch calls go through
// ListerWatcher, its watch errors to HandleWatchError. namespace ("" =
// all) and tweak (may be nil) must be those the factory was made with, so
// that factory.Core().V1().Services() is this informer (same indexers as
// the factory's own). Call it before anything else asks the factory for
// Services and before it starts; it returns an error when the factory
// already holds another Service informer.
//
// Its watches carry no timeout of their own (serverWatchTimeout): the API
// server ends them after its --min-request-timeout.
//
// The informer stores Services without their metadata.managedFields
// (StripManagedFields): nobody reading the cache needs them, and they are
// about a third of a Service's size in memory.
func (t *Tracker) ServiceInformer(factory informers.SharedInformerFactory, namespace string, tweak func(*metav1.ListOptions)) (cache.SharedIndexInformer, error) {
	var made cache.SharedIndexInformer
	var setErr error
	inf := factory.InformerFor(&corev1.Service{}, func(kube kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				if tweak != nil {
					tweak(&o)
				}
				return kube.CoreV1().Services(namespace).List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				if tweak != nil {
					tweak(&o)
				}
				serverWatchTimeout(&o)
				return kube.CoreV1().Services(namespace).Watch(ctx, o)
			},
		}
		made = cache.NewSharedIndexInformerWithOptions(t.ListerWatcher(lw), &corev1.Service{}, cache.SharedIndexInformerOptions{
			ResyncPeriod: resync,
			Indexers:     cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		})
		if err := made.SetTransform(StripManagedFields); err != nil {
			setErr = err
		}
		return made
	})
	if inf != made {
		return nil, errServiceInformerTaken
	}
	if setErr != nil {
		return nil, setErr
	}
	return inf, t.Instrument(inf)
}

// serverWatchTimeout drops the timeout client-go's reflector asks for on
// each watch (5–10 minutes), so the API server ends the watch when its own
// --min-request-timeout says (default 30–60 minutes, at random), as for
// any client that asks none. Re-opening the watch (from the last
// resourceVersion, no list) is then the informer's only request while
// nothing changes, a sixth as often. A dead connection is still found by
// the HTTP/2 health check of client-go's transport, not by this timeout.
func serverWatchTimeout(o *metav1.ListOptions) { o.TimeoutSeconds = nil }

// StripManagedFields is an informer transform (cache.TransformFunc): it
// drops metadata.managedFields from an object before the informer stores
// it, and passes anything without object metadata (a
// cache.DeletedFinalStateUnknown) through unchanged. It never fails. A
// write built from such an object sends no managedFields, which the API
// server reads as "keep them as they are".
func StripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}
