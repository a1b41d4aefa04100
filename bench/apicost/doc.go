// Command apicost measures how much kube-apiserver CPU one Service delete
// costs under different client shapes, on a real kube-apiserver + etcd
// (package kubelocal) started for the run.
//
// Each variant creates N Services (raw client-go, 50 in flight), then
// deletes them in its own way and reports the wall time, the rate and the
// API server's user+system CPU per delete (from /proc/<pid>/stat of the
// kube-apiserver process it started). Variants:
//
//	floor        one JSON client, --in-flight calls at once, no rate limit
//	clients3     three protobuf clients, 96 calls in flight, no rate limit
//	paced:R      like clients3, but at most R deletes per second in total
//	watchers:W   like floor, with W protobuf Service informers open
//
// The variants run in the order given, --repeat times, alternating, so a
// drift of the machine shows as spread within a variant rather than as a
// difference between variants. It answers questions such as "does the API
// server spend more CPU per delete when deletes arrive more slowly?" that
// the end-to-end table (bench/e2e) cannot separate from matbus's own CPU.
//
//	go run ./bench/apicost --services 2000 --repeat 2 --variants floor,clients3,paced:330,watchers:4
//
// The binaries come from .bin/ (make tools). Nothing is asserted: it is a
// measurement tool. Everything it starts is stopped when it ends.
package main
