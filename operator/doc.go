// Package operator owns the read-only tools an operator runs against a live namespace; for now the takeover dry run (Plan: what a worker would create, update, recreate, delete and adopt there).
// It reads MAT statuses and the Kubernetes API (GET Deployments, LIST Services) and plans with package plan exactly as the worker does; rendering its answers as text or JSON is here too.
// It never writes: no create, update, patch or delete of any object, no NATS, no global state.
package operator
