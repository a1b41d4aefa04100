// Package kubeconn makes a matbus process's Kubernetes client
// configuration: from a kubeconfig file or the in-cluster environment,
// with CA and client certificate files kept current (internal/kubetls),
// the client-side limit (kuberate's adaptive limiter or client-go's fixed
// token bucket), protobuf content types, the user agent and compression
// off; and Reachable, the bounded /version check of the one-shot
// commands. It never reads a token itself (client-go does).
package kubeconn
