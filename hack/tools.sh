#!/usr/bin/env bash
# Builds the real parts the tests and `make run` need into .bin/ from Go
# modules (no binary downloads): etcd and kube-apiserver from tools/k8s,
# helm from tools/helm, promtool from tools/promtool.
# A stamp of the tools module's go.sum decides whether a rebuild is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/.bin"
mkdir -p "$bin"

build_module_tools() { # <dir> <stamp> <builds...>
	local dir=$1 stamp=$2
	shift 2
	local want
	# CGO_ENABLED (when set) is part of the stamp: static builds replace dynamic ones once.
	want=$({ sha256sum "$dir/go.mod" "$dir/go.sum"; printf '%s' "${CGO_ENABLED:+CGO_ENABLED=$CGO_ENABLED}"; } | sha256sum | cut -c1-16)
	if [ -f "$bin/$stamp.stamp" ] && [ "$(cat "$bin/$stamp.stamp")" = "$want" ]; then
		local ok=1
		for b in "$@"; do [ -x "$bin/${b%%=*}" ] || ok=0; done
		[ $ok = 1 ] && return 0
	fi
	for b in "$@"; do
		local name=${b%%=*} pkg=${b#*=}
		if [ "$name" = kube-apiserver ]; then
			echo ">> building kube-apiserver from Go modules into .bin/ — the first build takes about 12 minutes on 2 cores (more when other work shares them); later ones take seconds"
		else
			echo ">> building $name from Go modules ($pkg) into .bin/"
		fi
		(cd "$dir" && go build -trimpath -o "$bin/$name" "$pkg")
	done
	echo "$want" >"$bin/$stamp.stamp"
}

# etcd, etcdctl, kube-apiserver and nats-server are static (CGO_ENABLED=0): `make compose-e2e` also
# copies them into the local stand-ins of the upstream images (hack/compose-e2e.sh).
CGO_ENABLED=0 build_module_tools tools/k8s k8s "etcd=./etcd" "etcdctl=go.etcd.io/etcd/etcdctl/v3" "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver"
# `make run` needs only those (`hack/tools.sh apiserver`).
[ "${1:-}" = apiserver ] && exit 0
# helm (for `make deploy-check`); its default Kubernetes version is set to the API server's (v1.37) for `helm template`/`lint`.
GOFLAGS="-buildvcs=false -ldflags=-X=helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37" build_module_tools tools/helm helm "helm=helm.sh/helm/v3/cmd/helm"
# promtool (for `make alerts-test`: promtool check rules / test rules on the chart's alerts), of the Prometheus
# version the project's go.mod requires. remove_all_sd leaves out the service-discovery plugins (cloud SDKs), which
# rule checks and tests never use: a fifth fewer packages to compile.
GOFLAGS="-buildvcs=false -tags=remove_all_sd" build_module_tools tools/promtool promtool "promtool=github.com/prometheus/prometheus/cmd/promtool"
# nats-server (a separate process for the fault tests in faulttest/), from the version in the project's go.mod.
CGO_ENABLED=0 build_module_tools . nats "nats-server=github.com/nats-io/nats-server/v2"
# The rest of a node for `make kube-e2e` (hack/kube-e2e.sh, docs/adr/0021-kube-e2e-node.md), only when asked
# (`hack/tools.sh node`): the same Kubernetes module as kube-apiserver, so the versions match (no skew).
if [ "${1:-}" = node ]; then
	CGO_ENABLED=0 build_module_tools tools/k8s k8s-node "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager" "kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler" "kubelet=k8s.io/kubernetes/cmd/kubelet"
fi
# The node's image builder and pause program (tools/image).
if [ "${1:-}" = node ]; then
	CGO_ENABLED=0 build_module_tools tools/image image "ociimage=." "pause=./pause"
	# kube-proxy (the node's Service routing) and kubectl (the script's waits, checks and failure dumps), of the same
	# module; a stamp of their own, so adding them rebuilt nothing above.
	CGO_ENABLED=0 build_module_tools tools/k8s k8s-proxy "kube-proxy=k8s.io/kubernetes/cmd/kube-proxy" "kubectl=k8s.io/kubernetes/cmd/kubectl"
	# CoreDNS with the plugins the node needs (tools/coredns/main.go): cluster.local from the API server.
	CGO_ENABLED=0 build_module_tools tools/coredns coredns "coredns=."
fi
