// Package worker owns the handlers that do matbus's work, run by the job
// runtime internal/jobs: instance events keep a cache of MAT API clients by
// URL; sync jobs fetch a status, plan and apply Service changes and fan out
// delete jobs; delete jobs delete one Service each; every failure becomes an
// error event. A sync reads the Services it plans against from its Service
// informer through plan.Existing, the rule `matbus plan` runs too. It never
// discovers instances itself, and never pulls, acks or naks a message itself
// (internal/jobs does, from the handler's outcome).
package worker
