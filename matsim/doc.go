// Package matsim simulates machine-a-tron (MAT) instances for tests and
// local runs: it generates deterministic fleets (hosts with nested DPUs,
// switches, power shelves and their mock BMCs) and serves them, or a
// fixture file byte for byte, on `GET /machines/status` over HTTP or HTTPS
// (self-signed ECDSA certificate), in the v2 or the legacy shape.
//
// Responses carry a strong ETag of the body (rendered once per change and
// cached) and a matching If-None-Match is answered 304 Not Modified, per
// RFC 9110; Options.DisableETag serves like a MAT without that feature.
// A Server supports churn (SetFleet, RemoveDevice, SetBMCIP, with MAT's
// generation rule), fault injection (FaultMode) and counters of requests
// (304s among them), bytes sent and accepted TCP connections, so tests can
// prove that clients reuse connections and benchmarks can weigh what
// polling costs. It holds no global state; Close stops every goroutine.
package matsim
