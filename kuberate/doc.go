// Package kuberate is an adaptive client-side limit for Kubernetes API
// requests: a token bucket whose rate, and a cap on requests in flight,
// rise while the client's demand fills them (the rate additively, the
// cap by doubling until its first decrease, then additively) and fall
// multiplicatively when the API server pushes back (429, Retry-After,
// 502/503/504) or its write latency rises above the baseline. It plugs into
// client-go as rest.Config.RateLimiter and rest.Config.WrapTransport (see
// Limiter.Apply). It never retries, reads or changes objects itself.
package kuberate
