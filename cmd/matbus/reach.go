package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes"
)

// reachWait is how long the one-shot commands (status, errors, plan) wait
// for NATS or the Kubernetes API server before they give up and say why:
// long enough for a server that is starting, short enough that a wrong
// address is reported while the user still looks.
const reachWait = 5 * time.Second

// kubeReachable asks the API server for /version (any authenticated client
// may read it) within wait and returns nil, or an error naming the server
// and the cause.
func kubeReachable(ctx context.Context, kube kubernetes.Interface, host string, wait time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := kube.Discovery().RESTClient().Get().AbsPath("/version").Do(rctx).Error()
	if err == nil {
		return nil
	}
	if rctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("the Kubernetes API server at %s is not reachable (no answer in %s): %w", host, wait, err)
	}
	return fmt.Errorf("the Kubernetes API server at %s is not reachable: %w", host, err)
}
