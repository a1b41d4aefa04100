//go:build tools

// Package tools pins the kube-apiserver and etcdctl commands so `go mod
// tidy` keeps them (etcdctl: the compose etcd image's healthcheck tool).
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
