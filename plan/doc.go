// Package plan owns the pure planning of BMC Services: the desired Services for one MAT status (names, labels, annotations, ports, BMC IP), and the diff against existing Services into create / update / recreate / delete.
// It decides name shortening, label-value hashing, duplicate-IP, name-collision, clashing-port and invalid-device policy, and which existing Services are ours to change (managed-by, instance, pod), keeping foreign labels, annotations and owner references.
// It never does I/O: no Kubernetes client, no NATS, no HTTP, no clock, no logging — it takes values and returns values, and never mutates its inputs.
package plan
