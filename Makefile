# matbus — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
export MATBUS_BIN_DIR := $(CURDIR)/.bin
ARGS ?=
BENCH_ARGS ?=

.PHONY: all build tools run test lint unit fuzz fuzz-long newcomer bench bench-e2e clean deploy-check alerts-test faulttest faulttest-long compose-e2e kube-e2e

all: build

## build: the matbus binary into bin/
build:
	$(GO) build -trimpath -ldflags "-X main.commit=$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" -o bin/matbus ./cmd/matbus

## tools: etcd, kube-apiserver, helm, promtool and nats-server built from Go modules into .bin/ (once)
tools:
	@bash hack/tools.sh

## run (builds only etcd and kube-apiserver of the tools): the whole pipeline in one process (embedded NATS, simulators, local
## kube-apiserver unless KUBECONFIG is set, discovery, workers). ARGS="--once" exits when converged.
run: build
	@bash hack/tools.sh apiserver
	./bin/matbus dev $(ARGS)

## test: everything CI runs — lint, the chart's checks and alert tests, unit and
## integration tests with -race on real NATS and a real kube-apiserver + etcd,
## a short fuzz of every decoder, and the README's first screen as a newcomer runs it.
test: tools lint deploy-check alerts-test unit fuzz newcomer

## newcomer: what the README says to do, on the built tools: make run
## ARGS="--once", then each "Next steps" command of a running `matbus dev`
## as it prints it (exit 0 and the README's key lines; the README's block
## and dev's agree). Needs port 4222, as make run does.
newcomer: build
	@bash hack/tools.sh apiserver
	bash hack/newcomer.sh

lint:
	@echo ">> no tracked file over 1 MiB, no tracked symbolic link"; bash hack/large-files.sh
	@echo ">> gofmt"; out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@echo ">> go vet"; $(GO) vet ./...
	@echo ">> staticcheck"; $(GO) run $(STATICCHECK) ./...

# deploytest runs in deploy-check (after helm lint), not twice.
unit:
	MATBUS_REQUIRE_K8S=1 $(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v /deploytest)

# FUZZTIME is an execution count ("Nx"), not a duration: a duration-bound
# run can fail with a bare "context deadline exceeded" when the deadline
# catches a worker mid-input (go.dev/issue/75804), with nothing to reproduce.
# 10000x takes 3-9 s per target on 2 cores.
FUZZTIME ?= 10000x
## fuzz: each fuzz target for FUZZTIME executions (10000x in CI; `make fuzz-long` runs 500000x each)
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./matclient
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./events
	$(GO) test -run '^$$' -fuzz '^FuzzServiceName$$' -fuzztime $(FUZZTIME) ./plan
	$(GO) test -run '^$$' -fuzz '^FuzzLabelValue$$' -fuzztime $(FUZZTIME) ./plan

fuzz-long:
	$(MAKE) fuzz FUZZTIME=500000x

## faulttest: only the fault tests (worker and discovery processes of the built
## binary, a nats-server process, kube-apiserver + etcd; kill -9, restarts,
## outages). `make unit` runs them too; see docs/delivery-guarantees.md.
faulttest: tools
	MATBUS_REQUIRE_K8S=1 $(GO) test -race -count=1 -timeout 20m -v ./faulttest

## faulttest-long: the fault tests with 20 kill -9 trials, the slow variants (a
## NATS outage longer than a publish is retried) and matbus processes built
## with -race (their data races fail the tests)
faulttest-long: tools
	FAULT_TRIALS=20 FAULT_LONG=1 FAULT_RACE=1 MATBUS_REQUIRE_K8S=1 $(GO) test -race -count=1 -timeout 40m -v ./faulttest

## bench: benchmarks of the decoder and the planner, as a table
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./matclient ./plan ./events

## bench-e2e: the whole pipeline (nats-server, kube-apiserver + etcd, MAT
## simulators, discovery and worker processes) against a raw client-go floor,
## printed as one table (docs/performance.md); kube-apiserver and etcd pinned to
## their own CPU(s) unless BENCH_ARGS has --pin-control-plane=false (or the
## machine has fewer than 2). BENCH_ARGS="--services 10000 --json out.json"
bench-e2e: tools build
	$(GO) run ./bench/e2e --matbus bin/matbus $(BENCH_ARGS)

clean:
	rm -rf bin .run

## deploy-check: the Helm chart (helm lint; helm template with default and all
## optional values, each object server-side dry-run on a local kube-apiserver;
## discovery + worker run as the chart's ServiceAccount) and docker-compose.yaml
## (compose-spec loader; flags and env against `matbus <sub> --help`). No Docker needed.
deploy-check: tools
	$(MATBUS_BIN_DIR)/helm lint --strict deploy/helm/matbus
	MATBUS_REQUIRE_K8S=1 $(GO) test -count=1 -timeout 10m ./deploytest/...

## alerts-test: the chart's alerts under promtool (built from go.mod's
## Prometheus): `check rules` on files/prometheus-rules.yaml, and `test rules`
## on deploy/prometheus/rules_test.yaml, which feeds series in and expects each
## alert, with its labels and annotations, to fire or stay quiet at given times.
## (That those series are the ones matbus exports is deploytest's
## TestAlertsAndDashboardSelectExportedSeries, in deploy-check.)
alerts-test: tools
	$(MATBUS_BIN_DIR)/promtool check rules --lint-fatal deploy/helm/matbus/files/prometheus-rules.yaml
	$(MATBUS_BIN_DIR)/promtool test rules deploy/prometheus/rules_test.yaml

## compose-e2e: docker-compose.yaml under a real container engine, as root:
## installs docker.io if missing, builds the Compose plugin from its Go module,
## starts a private dockerd, builds local stand-ins of the images, runs
## `up --wait`, scale, stop, restart and `down -v` checks, then stops the
## engine and restores the host (docs/adr/0011-compose-e2e.md). CI runs it.
compose-e2e: tools
	bash hack/compose-e2e.sh

## kube-e2e: the Helm chart on a real single-node cluster, as root: builds
## kubelet, kube-controller-manager, kube-scheduler, kube-proxy and CoreDNS
## from Go modules, runs Debian's containerd, runc and CNI plugins privately,
## builds the images locally, installs the chart and runs the scenario in
## deploytest/kubee2e, then removes everything it made
## (docs/adr/0021-kube-e2e-node.md). CI runs it.
kube-e2e: tools
	bash hack/kube-e2e.sh
