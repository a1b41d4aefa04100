// Package kubeevents owns matbus's Kubernetes Events (events.k8s.io/v1):
// the reasons it records, the objects they regard (the discovered MAT
// Service of an instance, or a BMC Service), and a Recorder on client-go's
// event broadcaster with its spam filter and series aggregation. It never
// decides what failed: the worker and discovery tell it.
package kubeevents
