// Package faulttest proves matbus's delivery guarantees under faults with
// real processes: the built `matbus` binary as worker and discovery
// processes, a separate `nats-server` process with a file store, and a real
// kube-apiserver + etcd (kubelocal). Its tests kill, restart and starve those
// processes and check what docs/delivery-guarantees.md promises. It holds no
// production code.
package faulttest
