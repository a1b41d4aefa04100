//go:build tools

// Package tools pins the kube-apiserver and etcdctl commands so `go mod
// tidy` keeps them (etcdctl: the compose etcd image's healthcheck tool),
// and the rest of the kube-e2e node (hack/kube-e2e.sh): controller manager,
// scheduler, kubelet, kube-proxy and kubectl.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
