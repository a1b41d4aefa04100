// Package health is a matbus process's runtime support: the readiness
// conditions (NATS connected, the Kubernetes API answering its /version
// probe, an informer listing and watching, something succeeding within a
// staleness bound), the WARN lines while not ready, the Prometheus
// collectors of what the worker, the scheduler, the bus and the Kubernetes
// client count (metric names and help unchanged), the worker's and
// discovery's registries and readiness, and the one listener of /healthz,
// /readyz, /metrics and, when asked, /debug/pprof/ (Options: --health-addr,
// --profiling).
//
// It reads what other packages count and serves it; it never decides what
// a process does, and registers its two flags but never parses any:
// cmd/matbus says which conditions and collectors each subcommand has.
package health
