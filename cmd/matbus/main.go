package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/health"
	"github.com/matbus/matbus/internal/redact"
)

// subcommand runs one matbus subcommand with its arguments.
type subcommand struct {
	summary string
	run     func(ctx context.Context, args []string, env env) error
	// usageStatus is the exit status of a usage error; 0 means 2.
	usageStatus int
}

// env is what a subcommand may use of the outside world; tests pass their own.
type env struct {
	stdout, stderr io.Writer
	// lookupEnv reads the environment (os.LookupEnv: value, and whether set).
	lookupEnv cliflag.Lookup
}

func subcommands() map[string]subcommand {
	return map[string]subcommand{
		"discovery": {summary: "Watch for MAT instances and publish instance and sync events (leader-elected).", run: runDiscovery},
		"worker":    {summary: "Consume instance events, sync jobs and delete jobs; keep BMC Services in step.", run: runWorker},
		"dev":       {summary: "Run the whole pipeline in one process: embedded NATS, simulators, local kube-apiserver, discovery, workers.", run: runDev},
		"errors":    {summary: "Print error events as they arrive (and recent ones with --since).", run: runErrors},
		"matsim":    {summary: "Serve a simulated MAT `GET /machines/status` from a generated fleet or a fixture file.", run: runMatsim},
		"probe":     {summary: "GET a URL and exit 0 on a 2xx answer (a healthcheck for containers without curl).", run: runProbe},
		"check":     {summary: "Pre-flight check: what will fail (NATS, Kubernetes API, namespace, RBAC, IP ranges, externalIPs admission); exits 1 on a problem.", run: runCheck},
		"plan":      {summary: "Dry run: what a worker would create, update, recreate, delete and adopt in the namespace; writes nothing; exits 2 when something would change, 1 on an error or invalid flags.", run: runPlan, usageStatus: 1},
		"status":    {summary: "One row per instance (rotation, last good sync, Services, last error, worker, published) and the pipeline's summary, from what matbus publishes.", run: runStatus},
		"version":   {summary: "Print the matbus version.", run: runVersion},
	}
}

// version and commit are set at build time with
// -ldflags "-X main.version=... -X main.commit=..."; the commit in the Go
// build info (vcs.revision) wins when there is one.
var version, commit = "dev", ""

func main() {
	// SIGHUP (a closed terminal) stops like SIGINT and SIGTERM, so `dev`
	// removes its temporary state on every way out but SIGKILL.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	code := run(ctx, os.Args[1:], env{stdout: os.Stdout, stderr: os.Stderr, lookupEnv: os.LookupEnv})
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, e env) int {
	cmds := subcommands()
	if len(args) == 0 {
		usage(e.stderr, cmds)
		return 2
	}
	if args[0] == "help" && len(args) > 1 {
		args = []string{args[1], "--help"} // matbus help <subcommand>
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(e.stdout, cmds)
		return 0
	}
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "matbus: unknown subcommand %q\nRun `matbus help` for the subcommands.\n", args[0])
		return 2
	}
	err := c.run(ctx, args[1:], e)
	var help *cliflag.HelpError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &help):
		help.Usage(e.stdout)
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		// One line naming what is wrong, one hint; not every flag.
		fmt.Fprintf(e.stderr, "matbus %s: %s\nRun `matbus help %s` for its flags.\n", args[0],
			strings.TrimPrefix(redact.StripUserInfo(err.Error()), errUsage.Error()+": "), args[0])
		if c.usageStatus != 0 {
			return c.usageStatus
		}
		return 2
	default:
		var ec exitCode
		if errors.As(err, &ec) {
			return int(ec)
		}
		fmt.Fprintf(e.stderr, "matbus %s: %s\n", args[0], redact.StripUserInfo(err.Error()))
		return 1
	}
}

// errUsage marks invalid flags or arguments (exit status 2, or the
// subcommand's usageStatus: plan keeps 2 for "something would change").
var errUsage = errors.New("usage")

// exitCode ends the process with that status and no message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func usage(w io.Writer, cmds map[string]subcommand) {
	fmt.Fprintf(w, "matbus keeps a Kubernetes Service per simulated MAT BMC, driven by NATS JetStream events.\n\nUsage: matbus <subcommand> [flags]\n\nSubcommands:\n")
	for _, n := range []string{"dev", "discovery", "worker", "check", "plan", "status", "errors", "matsim", "probe", "version"} {
		fmt.Fprintf(w, "  %-10s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintf(w, "\nRun `matbus <subcommand> --help` for its flags; every flag can also be set by an environment variable.\n")
}

func runVersion(_ context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("version", "Print the matbus version.")
	if err := cliflag.Parse(fs, args, e.lookupEnv); err != nil {
		return usageErr(err)
	}
	fmt.Fprintf(e.stdout, "matbus %s (commit %s, %s)\n", version, health.Revision(commit), runtime.Version())
	return nil
}

func usageErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return fmt.Errorf("%w: %v", errUsage, err)
}
