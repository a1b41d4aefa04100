// Package matclient owns the HTTP client for one machine-a-tron (MAT) instance's `GET /machines/status`: URL validation, timeouts, a body cap, connection reuse, io.Closer.
// It decodes and strictly validates both status shapes (legacy and v2) into a Status, and classifies failures (HTTPError, ErrInvalidStatus, IsTransient) for the caller.
// StatusIfChanged polls cheaply: it fingerprints the body, and where MAT sends a strong ETag it asks with If-None-Match and takes a 304 as "unchanged" (ADR 23); a MAT without ETags gets the same requests as ever. PollStatus also says whether MAT answered 304 (Poll.NotModified).
// It never knows about Kubernetes, NATS or Services, never retries and never logs: what to do with a status or an error is the caller's business.
package matclient
