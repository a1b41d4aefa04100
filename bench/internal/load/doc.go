// Package load holds what the benchmark commands (bench/e2e,
// bench/apicost) share: running n calls with k in flight and timing them
// (InParallel), and reading the CPU time of the calling process and every
// process it started, by program (or by a role the caller names), from
// /proc (SampleCPU, SampleCPUNamed).
package load
