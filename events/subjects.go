package events

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultPrefix is the first token of every matbus subject.
const DefaultPrefix = "mat"

// Subjects builds matbus subject names under one prefix. The layout is
//
//	<prefix>.instances.<key>     instance appeared / gone, last message per subject kept
//	<prefix>.jobs.sync.<key>     sync jobs (work queue)
//	<prefix>.jobs.cleanup.<key>  clean-up jobs of a gone instance (work queue)
//	<prefix>.jobs.delete.<key>   one delete job per Service (work queue)
//	<prefix>.errors.<kind>       error events, retained for a bounded time and size
//	<prefix>.results.<key>       outcome of each sync job, core NATS (not stored), read by the scheduler
//
// where <key> is "<namespace>.<name>" (see Key). The zero value uses DefaultPrefix.
type Subjects struct {
	Prefix string
}

func (s Subjects) p() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// Instance is the subject of instance events of key.
func (s Subjects) Instance(key string) string { return s.p() + ".instances." + key }

// Instances matches every instance subject.
func (s Subjects) Instances() string { return s.p() + ".instances.>" }

// Sync is the subject of sync jobs of key.
func (s Subjects) Sync(key string) string { return s.p() + ".jobs.sync." + key }

// Cleanup is the subject of clean-up jobs of key.
func (s Subjects) Cleanup(key string) string { return s.p() + ".jobs.cleanup." + key }

// Delete is the subject of delete jobs of Services of instance key.
func (s Subjects) Delete(key string) string { return s.p() + ".jobs.delete." + key }

// SyncJobs matches every sync subject; CleanupJobs and DeleteJobs likewise.
func (s Subjects) SyncJobs() string { return s.p() + ".jobs.sync.>" }

// CleanupJobs matches every clean-up subject.
func (s Subjects) CleanupJobs() string { return s.p() + ".jobs.cleanup.>" }

// DeleteJobs matches every delete subject.
func (s Subjects) DeleteJobs() string { return s.p() + ".jobs.delete.>" }

// Error is the subject of error events of kind.
func (s Subjects) Error(kind ErrorKind) string { return s.p() + ".errors." + string(kind) }

// Result is the subject on which workers report the outcome of a sync job
// of key to the discovery scheduler (core NATS: not stored in any stream).
func (s Subjects) Result(key string) string { return s.p() + ".results." + key }

// Results matches every result subject.
func (s Subjects) Results() string { return s.p() + ".results.>" }

// InstancesIn matches the instance subjects of namespace ns (every
// namespace when ns is empty); SyncJobsIn, CleanupJobsIn, DeleteJobsIn and
// ResultsIn likewise. A pipeline reads only its own namespace's subjects
// (docs/adr/0008-one-pipeline-per-namespace.md).
func (s Subjects) InstancesIn(ns string) string { return s.in(s.Instances(), ns) }

// SyncJobsIn matches the sync subjects of namespace ns (all when empty).
func (s Subjects) SyncJobsIn(ns string) string { return s.in(s.SyncJobs(), ns) }

// CleanupJobsIn matches the clean-up subjects of namespace ns (all when empty).
func (s Subjects) CleanupJobsIn(ns string) string { return s.in(s.CleanupJobs(), ns) }

// DeleteJobsIn matches the delete subjects of namespace ns (all when empty).
func (s Subjects) DeleteJobsIn(ns string) string { return s.in(s.DeleteJobs(), ns) }

// ResultsIn matches the result subjects of namespace ns (all when empty).
func (s Subjects) ResultsIn(ns string) string { return s.in(s.Results(), ns) }

// in narrows a "<...>.>" wildcard to "<...>.<ns>.*".
func (s Subjects) in(all, ns string) string {
	if ns == "" {
		return all
	}
	return strings.TrimSuffix(all, ">") + ns + ".*"
}

// Errors matches every error subject ("mat.errors.>").
func (s Subjects) Errors() string { return s.p() + ".errors.>" }

// KeyFromSubject returns the instance key at the end of an instance or job
// subject, e.g. "ns.name" from "mat.jobs.sync.ns.name".
func KeyFromSubject(subject string) (string, bool) {
	parts := strings.Split(subject, ".")
	if len(parts) < 2 {
		return "", false
	}
	key := parts[len(parts)-2] + "." + parts[len(parts)-1]
	return key, ValidateKey(key) == nil
}

// ValidatePrefix reports whether p can be a subject prefix: one or more
// tokens of [A-Za-z0-9_-] separated by dots.
func ValidatePrefix(p string) error {
	if p == "" {
		return fmt.Errorf("events: empty subject prefix")
	}
	for _, tok := range strings.Split(p, ".") {
		if tok == "" {
			return fmt.Errorf("events: subject prefix %q has an empty token", p)
		}
		for _, r := range tok {
			if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return fmt.Errorf("events: subject prefix %q: character %q not allowed", p, r)
			}
		}
	}
	return nil
}

// Key returns the instance key "<namespace>.<name>". Both parts must be DNS
// labels (RFC 1123, at most 63 characters), so the key has exactly one dot and
// maps to exactly two subject tokens. It returns an error naming the bad part.
func Key(namespace, name string) (string, error) {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", fmt.Errorf("events: namespace %q is not a DNS label: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return "", fmt.Errorf("events: name %q is not a DNS label: %s", name, strings.Join(errs, "; "))
	}
	return namespace + "." + name, nil
}

// SplitKey splits a key made by Key into namespace and name.
func SplitKey(key string) (namespace, name string, err error) {
	ns, n, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", fmt.Errorf("events: instance key %q has no dot", key)
	}
	if _, err := Key(ns, n); err != nil {
		return "", "", fmt.Errorf("events: instance key %q: %w", key, err)
	}
	return ns, n, nil
}

// ValidateKey returns an error unless key is "<namespace>.<name>" of two DNS labels.
func ValidateKey(key string) error {
	_, _, err := SplitKey(key)
	return err
}
