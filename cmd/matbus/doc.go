// Command matbus is the one binary of matbus. Its subcommands start the
// parts of the pipeline: `discovery` (publisher), `worker`, `dev` (the whole
// pipeline in one process on embedded defaults, package internal/devenv),
// `errors` (tail error events) and `matsim` (a MAT simulator); `check`,
// `plan` and `status` are the operator tools of package operator. It holds
// wiring, not business logic: each subcommand reads its flags, converts
// them once to its packages' configurations (workerOpts.config,
// schedOpts.publisherConfig, ...) and calls them. Readiness, metrics and
// the health listener are package internal/health's; reading flags from
// the environment internal/cliflag's; the NATS connection
// internal/natsconn's; the Kubernetes client configuration
// internal/kubeconn's.
package main
