// Package operator owns the tools an operator runs against a live namespace: the pre-flight check (Check: NATS, the Kubernetes API, RBAC, IPs against the service range), the takeover dry run (Plan: what a worker would create, update, recreate, delete and adopt) and the pipeline's status (Status: one row per instance from the state and streams matbus publishes).
// It reads MAT statuses, NATS JetStream and the Kubernetes API, and plans with package plan exactly as the worker does; rendering its answers as text or JSON is here too.
// It never changes anything: no create, update, patch or delete of any Kubernetes object, stream or bucket (check's one create is a server-side dry run; status reads the error stream through an ephemeral ordered consumer), and no global state.
package operator
