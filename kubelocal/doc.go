// Package kubelocal starts a real, throw-away Kubernetes control plane on
// this machine: an etcd and a kube-apiserver process built from Go modules
// (see tools/k8s), on free loopback ports, with token authentication and RBAC.
// `matbus dev` and the integration tests use it; it never runs MAT or NATS.
package kubelocal
