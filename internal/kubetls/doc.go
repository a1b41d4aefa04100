// Package kubetls owns the TLS of matbus's Kubernetes clients when a
// kubeconfig (or the in-cluster configuration) names files: the CA file
// and the client certificate and key are kept current with internal/reload
// in a transport of its own, so a rotated CA or certificate is used from
// the next connection on. It never touches tokens (client-go re-reads a
// token file itself) and never logs a file's contents.
package kubetls
