// Command coredns is CoreDNS (github.com/coredns/coredns at the version in
// go.mod) with only the plugins the node of `make kube-e2e` needs
// (hack/kube-e2e.sh): it serves cluster.local from the API server
// (kubernetes), on the node's bridge address (bind), with errors, log,
// cache and the health and ready endpoints. No forward plugin: pods resolve
// cluster names only, nothing is sent to another resolver. A tools module of
// its own, like tools/k8s, so its requirements never touch the project's
// go.mod.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins in the order CoreDNS runs them (its core/dnsserver/zdirectives.go,
// reduced to the ones imported above).
func init() {
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
