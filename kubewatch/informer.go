package kubewatch

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
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
func (t *Tracker) ServiceInformer(factory informers.SharedInformerFactory, namespace string, tweak func(*metav1.ListOptions)) (cache.SharedIndexInformer, error) {
	var made cache.SharedIndexInformer
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
				return kube.CoreV1().Services(namespace).Watch(ctx, o)
			},
		}
		made = cache.NewSharedIndexInformerWithOptions(t.ListerWatcher(lw), &corev1.Service{}, cache.SharedIndexInformerOptions{
			ResyncPeriod: resync,
			Indexers:     cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		})
		return made
	})
	if inf != made {
		return nil, errServiceInformerTaken
	}
	return inf, t.Instrument(inf)
}
