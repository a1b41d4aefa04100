// Package health is a matbus process's runtime support: the readiness
// conditions (NATS connected, the Kubernetes API answering its /version
// probe, an informer listing and watching, something succeeding within a
// staleness bound), the WARN lines while not ready, and the one listener of
// /healthz, /readyz, /metrics and, when asked, /debug/pprof/.
//
// It owns how readiness is judged and served, never what a process
// measures or does: cmd/matbus lists each subcommand's conditions and
// registers its metrics.
package health
