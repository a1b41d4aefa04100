// Package events owns matbus's wire contract on NATS JetStream: the event and
// job types with their JSON envelope and schema version, the subject names,
// the stream and durable consumer settings and the discovery leader's state
// bucket, with small publish and read helpers. It never talks to MAT or Kubernetes and holds no business logic.
package events
