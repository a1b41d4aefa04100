// Package deploytest checks the deployment artefacts under deploy/ and the
// top-level docker-compose.yaml without a container engine:
//
//   - the Helm chart: `helm lint`; `helm template` with the default values
//     and with every optional feature on, each object created with a
//     server-side dry run (strict field validation) on a real local
//     kube-apiserver; every flag and environment variable the rendered
//     containers use exists in `matbus <subcommand> --help`;
//   - the chart's RBAC: the rendered discovery and worker containers run as
//     processes under the chart's ServiceAccount identity (impersonated)
//     against the real API server and converge, and every API request they
//     make is recorded and compared with the Role;
//   - the chart's alerts and dashboard: every metric selector of the
//     rendered PrometheusRule and dashboard, and every input series of the
//     promtool test of the alerts, against /metrics of the chart's discovery
//     and worker containers run as processes (metric, type, labels), and
//     every alert tested firing and quiet (`make alerts-test` runs promtool);
//   - docker-compose.yaml, loaded with the compose-spec loader: commands,
//     flags and environment variables exist in `matbus <subcommand> --help`,
//     every built image comes from deploy/Dockerfile, pinned versions match
//     what the tests run; the nats-server, etcd and kube-apiserver command
//     lines start the real binaries (built from the same versions) with the
//     compose token, keys and service range, and the matbus services' command
//     lines, environment and mounted files run as processes and converge.
//
// The package holds tests only; `make deploy-check` runs them (and `make
// test` through it). Tests that need helm, etcd or kube-apiserver skip
// without them unless MATBUS_REQUIRE_K8S is set, as in CI.
package deploytest
