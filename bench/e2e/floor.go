package main

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// floorServices are the Services matbus would build for the base fleets,
// in namespace ns (plan.Build with the worker's default options).
func floorServices(ns string, base []*matsim.Fleet) []*corev1.Service {
	opts := plan.Options{Namespace: ns, TargetSelector: map[string]string{"app": "machine-a-tron"}}
	var out []*corev1.Service
	for i, fl := range base {
		d := plan.Build(plan.Instance{Key: ns + ".mat-" + strconv.Itoa(i)}, fl.Status("", 1), opts)
		out = append(out, d.Services...)
	}
	return out
}

// timed is one bulk operation of the floor: how long it took and how
// many of its calls failed. TimedOut is set when the deadline ended it.
type timed struct {
	Seconds  float64 `json:"seconds"`
	Calls    int     `json:"calls"`
	Failed   int     `json:"failed"`
	TimedOut bool    `json:"timed_out,omitempty"`
}

// inParallel runs call(0..n-1) with at most k calls in flight until all
// returned or ctx ends, and times it. Calls not started when ctx ends
// count as failed.
func inParallel(ctx context.Context, k, n int, call func(ctx context.Context, i int) error) timed {
	start := time.Now()
	var failed atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(k, n) {
		wg.Add(1)
		go func() { // ends when the indexes run out or ctx ends
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if ctx.Err() != nil || call(ctx, i) != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return timed{Seconds: time.Since(start).Seconds(), Calls: n, Failed: int(failed.Load()), TimedOut: ctx.Err() != nil}
}

// floorCreate creates svcs with k calls in flight.
func floorCreate(ctx context.Context, kube kubernetes.Interface, svcs []*corev1.Service, k int) timed {
	return inParallel(ctx, k, len(svcs), func(ctx context.Context, i int) error {
		_, err := kube.CoreV1().Services(svcs[i].Namespace).Create(ctx, svcs[i], metav1.CreateOptions{})
		return err
	})
}

// floorDelete deletes svcs (by name) with k calls in flight.
func floorDelete(ctx context.Context, kube kubernetes.Interface, svcs []*corev1.Service, k int) timed {
	return inParallel(ctx, k, len(svcs), func(ctx context.Context, i int) error {
		return kube.CoreV1().Services(svcs[i].Namespace).Delete(ctx, svcs[i].Name, metav1.DeleteOptions{})
	})
}
