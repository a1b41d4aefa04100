// Package discovery owns the sources of MAT instances (a Kubernetes Service
// informer, or a static list for local runs) and the publisher that turns
// their changes into instance-appeared and instance-gone events, clean-up
// jobs and periodic sync jobs, under client-go leader election (the leader
// keeps its view of each instance in the state bucket), and the sources API
// that every replica serves from its own passes. It never
// talks to MAT and never creates Services.
package discovery
