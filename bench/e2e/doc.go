// Command e2e measures the whole matbus pipeline end to end against a raw
// client-go floor, in one run on this machine, and prints one table.
//
// It starts, all on loopback: a nats-server process (JetStream, file store),
// a real kube-apiserver + etcd (package kubelocal), S matsim simulators
// in-process over HTTPS, one `matbus discovery` process with --static
// instances and --leader-elect=false, and W `matbus worker` processes. The
// matbus processes run with their default flags except what the harness
// must set (URLs, namespace, names, the static list, TLS skip-verify for
// matsim's self-signed certificates, health ports).
//
// Rows: converge from empty (floor: raw creates, 50 in flight), grow by 101
// BMCs, shrink by 101, delete fan-out of every Service (floor: raw
// deletes), reaction p50/p99 over single-BMC changes, API requests per
// steady minute (floor: the API server with nothing running), MAT GETs and
// new TCP connections per instance in the steady window, worker RSS.
//
//	go run ./bench/e2e [--services 2000] [--workers 1,3] [--repeat 1] [--json out.json]
//
// kube-apiserver and etcd run pinned to the first half of the CPUs the
// harness may use, everything else to the rest (pin.go), as on a cluster
// whose control plane has its own cores; --pin-control-plane=false, or a
// process that may use fewer than 2 CPUs, runs unpinned. The first line of
// the log and of the table says which, and how or why.
//
// --repeat N alternates the floor and the rounds N times; each cell is then
// the median over the repetitions and its ratio the median of each
// repetition's value ÷ the floor measured in that repetition.
//
// It is a measurement tool: every wait is bounded and a wait that runs out
// prints "timeout" in its row; nothing is asserted. docs/performance.md
// says what each row measures. The table goes to stdout, progress to
// stderr. Everything it starts is stopped, and every temporary folder
// removed, when it ends or on Ctrl-C.
package main
