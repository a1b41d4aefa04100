// Package devenv is `matbus dev`: the whole pipeline in one process on
// embedded parts. It owns what only that harness does: generating one
// fleet per simulator, starting the embedded NATS server, a local etcd +
// kube-apiserver (and the state folders of killed runs), the simulators,
// printing each Service change and each error event once, the convergence
// watch of --once and the banner and next-step commands.
//
// It never parses flags or builds a worker or a publisher configuration of
// its own: cmd/matbus converts its flags once (the same conversions as
// `discovery` and `worker`) and hands them over in Config and Parts.
package devenv
