// Package kubee2e runs the Helm chart on a real single-node Kubernetes
// cluster (kubelet, containerd, CNI, kube-proxy, CoreDNS): `make kube-e2e`
// (hack/kube-e2e.sh) brings the node up, loads the images and runs this
// package's test with MATBUS_KUBE_E2E=1 and the admin KUBECONFIG. It never
// starts a cluster itself; without that variable the test is skipped.
// Everything is done with client-go and the helm binary (no kubectl).
package kubee2e
