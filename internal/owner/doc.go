// Package owner owns the lookup of a MAT instance's owner: the MAT
// Deployment (events.Instance.Owner, in the namespace of the instance's key)
// whose owner reference the instance's BMC Services carry, read with one
// GET. The worker (which caches the answer) and `matbus plan` both call it.
// It never caches, writes or reports: a failed read is the caller's to
// report.
package owner
