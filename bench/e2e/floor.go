package main

import (
	"context"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/bench/internal/load"
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

// floorCreate creates svcs with k calls in flight. It sets each created
// Service's UID and resourceVersion in svcs, for floorDelete's
// preconditions.
func floorCreate(ctx context.Context, kube kubernetes.Interface, svcs []*corev1.Service, k int) load.Timed {
	return load.InParallel(ctx, k, len(svcs), func(ctx context.Context, i int) error {
		got, err := kube.CoreV1().Services(svcs[i].Namespace).Create(ctx, svcs[i], metav1.CreateOptions{})
		if err == nil {
			svcs[i].UID, svcs[i].ResourceVersion = got.UID, got.ResourceVersion
		}
		return err
	})
}

// floorDelete deletes svcs (by name) with k calls in flight. With
// preconditions, each delete carries its Service's UID and resourceVersion
// as preconditions, as a worker's delete job does (a Service without a UID
// is deleted without them).
func floorDelete(ctx context.Context, kube kubernetes.Interface, svcs []*corev1.Service, k int, preconditions bool) load.Timed {
	return load.InParallel(ctx, k, len(svcs), func(ctx context.Context, i int) error {
		var opts metav1.DeleteOptions
		if preconditions && svcs[i].UID != "" {
			uid, rv := svcs[i].UID, svcs[i].ResourceVersion
			opts.Preconditions = &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}
		}
		return kube.CoreV1().Services(svcs[i].Namespace).Delete(ctx, svcs[i].Name, opts)
	})
}
