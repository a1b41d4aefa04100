package kubewatch_test

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/matbus/matbus/kubewatch"
)

// The Service informer's watches (also the first, which may stream the
// initial list) ask no timeout of their own: the API server's
// --min-request-timeout ends them. They keep the caller's selector.
func TestServiceInformerWatchTimeout(t *testing.T) {
	kube := fake.NewClientset()
	var (
		mu      sync.Mutex
		watches []metav1.ListOptions
	)
	kube.PrependWatchReactor("services", func(a k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		watches = append(watches, a.(k8stesting.WatchActionImpl).ListOptions)
		return false, nil, nil
	})
	kube.PrependReactor("list", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.ListActionImpl).ListOptions.LabelSelector != "app=mat" {
			t.Errorf("list without the tweak's selector: %+v", a)
		}
		return false, nil, nil
	})
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = "app=mat" }
	factory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace("bmc"), informers.WithTweakListOptions(tweak))
	_, err := kubewatch.New("services", nil, nil).ServiceInformer(factory, "bmc", tweak)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); factory.Shutdown() }()
	factory.Start(ctx.Done())
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(watches)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no watch within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, o := range watches {
		if o.TimeoutSeconds != nil {
			t.Errorf("watch asks a timeout of %ds, want none (the API server's)", *o.TimeoutSeconds)
		}
		if o.LabelSelector != "app=mat" {
			t.Errorf("watch without the tweak's selector: %+v", o)
		}
	}
}
