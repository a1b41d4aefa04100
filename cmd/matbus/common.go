package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/kubeconn"
	"github.com/matbus/matbus/internal/natsconn"
	"github.com/matbus/matbus/internal/redact"
	"github.com/matbus/matbus/kubeevents"
	"github.com/matbus/matbus/kuberate"
)

// natsOpts are the flags every NATS user shares.
type natsOpts struct {
	natsconn.Config
	prefix string
	memory bool
	// replicas of every stream (--stream-replicas; 0 without
	// registerReplicas: the events default, 1).
	replicas     int
	withReplicas bool
	// namespace is the pipeline's namespace (events.Config.Namespace),
	// set by the subcommand; empty for readers of every namespace.
	namespace string
}

func (o *natsOpts) register(fs *flag.FlagSet) {
	o.AddFlags(fs)
	fs.StringVar(&o.prefix, "subject-prefix", events.DefaultPrefix, "first token(s) of every matbus subject")
}

// registerReplicas adds --stream-replicas to the commands that create the
// streams (worker, discovery).
func (o *natsOpts) registerReplicas(fs *flag.FlagSet) {
	o.withReplicas = true
	fs.IntVar(&o.replicas, "stream-replicas", 1, fmt.Sprintf("replicas of every matbus stream, 1 to %d; more than 1 needs a JetStream cluster of at least that many servers; discovery changes existing streams to it, a worker only creates missing ones with it (give every worker and discovery the same value)", events.MaxReplicas))
}

func (o *natsOpts) validate() error {
	if err := events.ValidatePrefix(o.prefix); err != nil {
		return fmt.Errorf("%w: --subject-prefix: %v", errUsage, err)
	}
	if o.withReplicas && (o.replicas < 1 || o.replicas > events.MaxReplicas) {
		return fmt.Errorf("%w: --stream-replicas %d: want 1 to %d", errUsage, o.replicas, events.MaxReplicas)
	}
	if err := o.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

// validURL is the usage error of a URL flag net/url cannot parse; it names
// the URL without its user info and never quotes a piece of it (a space or
// bad escape in a password): `invalid --nats-url "nats://***@h:4222":
// invalid userinfo`.
func validURL(flagName, raw string) error {
	if err := redact.ValidURL(flagName, raw); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

// connect dials NATS (natsconn.Connect) and keeps reconnecting forever.
func (o *natsOpts) connect(name string, log *slog.Logger) (*nats.Conn, error) {
	return natsconn.Connect(o.Config, name, log)
}

// bus returns the events.Bus of the pipeline in o.namespace; w (may be
// nil: discovery, errors) sets the job consumers' AckWait and MaxDeliver,
// the namespace and KeepStreams.
func (o *natsOpts) bus(nc *nats.Conn, source string, log *slog.Logger, w *workerOpts) (*events.Bus, error) {
	cfg := events.Config{Prefix: o.prefix, Source: source, Memory: o.memory, Namespace: o.namespace, Replicas: o.replicas}
	if w != nil {
		cfg.AckWait, cfg.MaxDeliver, cfg.Namespace = w.ackWait, w.maxDeliver, w.namespace
		// A worker creates a missing stream but never updates one: the
		// discovery publisher keeps the layout (events.Config.KeepStreams).
		cfg.KeepStreams = true
	}
	return events.New(nc, cfg, log)
}

// baseOpts are the NATS (with TLS and --stream-replicas), log and
// Kubernetes flags of worker, discovery, check and plan.
type baseOpts struct {
	n natsOpts
	l logOpts
	k kubeOpts
}

func (o *baseOpts) register(fs *flag.FlagSet) { o.registerAt(fs, "info") }

// registerAt registers the flags with --log-level's default level.
func (o *baseOpts) registerAt(fs *flag.FlagSet, level string) {
	o.n.register(fs)
	o.n.AddTLSFlags(fs) // an operator's NATS, not dev's embedded one
	o.n.registerReplicas(fs)
	o.l.registerAt(fs, level)
	o.k.register(fs)
}

// parse parses args (command line, then environment), checks the NATS
// and Kubernetes flags and then each of validators, and returns the logger
// of the flags writing to stderr, with component=component.
func (o *baseOpts) parse(fs *flag.FlagSet, args []string, e env, component string, validators ...func() error) (*slog.Logger, error) {
	if err := parseAndValidate(fs, args, e.lookupEnv, append([]func() error{o.n.validate, asUsage(o.k.Validate)}, validators...)...); err != nil {
		return nil, err
	}
	log, err := o.l.logger(e.stderr)
	if err != nil {
		return nil, err
	}
	return log.With("component", component), nil
}

// toolOpts are the flags of check and plan: the worker's and discovery's,
// so that their flags and environment apply unchanged.
type toolOpts struct {
	baseOpts
	w workerOpts
	d discoveryOpts
}

// register registers the flags; the log level is warn by default, so that
// no INFO line of a connection stands above the report.
func (o *toolOpts) register(fs *flag.FlagSet) {
	o.baseOpts.registerAt(fs, "warn")
	o.w.register(fs)
	o.d.register(fs)
}

// parse is baseOpts.parse with the worker's and discovery's checks, and
// reads --mat-ca-file.
func (o *toolOpts) parse(fs *flag.FlagSet, args []string, e env, component string, validators ...func() error) (*slog.Logger, error) {
	log, err := o.baseOpts.parse(fs, args, e, component, append([]func() error{o.w.validate, o.d.validate}, validators...)...)
	if err == nil {
		err = o.w.loadMatRoots(log)
	}
	return log, err
}

// logOpts select the log level and format. fs, when set, is the parsed
// flag set whose secrets (redact.FlagSecrets) the logger redacts.
type logOpts struct {
	level, format string
	fs            *flag.FlagSet
}

func (o *logOpts) register(fs *flag.FlagSet) { o.registerAt(fs, "info") }

// registerQuiet registers the flags with the level warn by default: for the
// commands whose output is a report (status, plan, check), so that no INFO
// line of a connection stands above it.
func (o *logOpts) registerQuiet(fs *flag.FlagSet) { o.registerAt(fs, "warn") }

func (o *logOpts) registerAt(fs *flag.FlagSet, level string) {
	fs.StringVar(&o.level, "log-level", level, "log level: debug, info, warn or error")
	fs.StringVar(&o.format, "log-format", "text", "log format: text or json")
	o.fs = fs
}

// logger returns the logger of --log-level and --log-format writing to w.
// Every line passes through a redact.Handler: the secrets of o.fs's flags
// (redact.FlagSecrets), the user info of URLs and bearer tokens never reach w.
// It returns an error wrapping errUsage for an unknown level or format.
func (o *logOpts) logger(w io.Writer) (*slog.Logger, error) {
	var secrets []string
	if o.fs != nil {
		secrets = redact.FlagSecrets(o.fs)
	}
	log, err := redact.NewLogger(w, o.level, o.format, secrets)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	// client-go logs through klog (leader election, informers): send those
	// lines through the same handler so --log-format=json stays JSON.
	klog.SetSlogLogger(log.With("logger", "client-go"))
	return log, nil
}

// kubeOpts are the --kube* flags (kubeconn.Config) and the adaptive
// limiter the last configuration was given (nil with --kube-rate=fixed or
// before restConfig or apply).
type kubeOpts struct {
	kubeconn.Config
	limiter *kuberate.Limiter
}

func (o *kubeOpts) register(fs *flag.FlagSet) {
	o.AddFlags(fs)
	o.UserAgent = "matbus/" + version
}

// restConfig is kubeconn.RESTConfig of o; it keeps the adaptive limiter
// in o.limiter for its metrics, and reports the API server's warnings to
// log (o.Warnings).
func (o *kubeOpts) restConfig(ctx context.Context, log *slog.Logger) (*rest.Config, error) {
	if o.Warnings == nil {
		o.Warnings = kubeconn.NewWarnings(log)
	}
	cfg, l, err := kubeconn.RESTConfig(ctx, o.Config, log)
	o.limiter = l
	return cfg, err
}

// apply is kubeconn.Apply of o; it keeps the adaptive limiter in o.limiter.
func (o *kubeOpts) apply(cfg *rest.Config) { o.limiter = kubeconn.Apply(cfg, o.Config) }

// registerMetrics registers the adaptive limiter's metrics
// (matbus_kube_rate_*, matbus_kube_inflight*, matbus_kube_apf_responses_total;
// see kuberate.Limiter.Collector; nothing with --kube-rate=fixed) and
// matbus_kube_warnings_total with reg.
func (o *kubeOpts) registerMetrics(reg prometheus.Registerer) {
	if o.limiter != nil {
		reg.MustRegister(o.limiter.Collector("matbus"))
	}
	if o.Warnings != nil {
		reg.MustRegister(o.Warnings.Collector())
	}
}

// kubeEventsUsage is the help of --kube-events (worker, discovery, dev).
const kubeEventsUsage = "record Kubernetes Events (events.k8s.io/v1) on the MAT Services (FetchFailed, OutOfRotation, ...) and BMC Services (CreateRefused, Recreated, ...), as kubectl describe svc shows them; needs create and patch on events.events.k8s.io"

// startKubeEvents returns the Kubernetes Event recorder of controller
// (kubeevents.ControllerWorker or ControllerDiscovery) on kube until ctx
// ends, or nil when on is false or there is no Kubernetes client.
func startKubeEvents(ctx context.Context, on bool, kube kubernetes.Interface, controller string, log *slog.Logger) (*kubeevents.Recorder, error) {
	if !on || kube == nil {
		return nil, nil
	}
	return kubeevents.Start(ctx, kube, kubeevents.Config{Controller: controller, Log: log})
}

func hostname() string {
	if v := os.Getenv("POD_NAME"); v != "" {
		return v
	}
	h, err := os.Hostname()
	if err != nil {
		return "matbus"
	}
	return h
}

// parseAndValidate parses args (command line first, then environment) and
// runs each validator; a parse failure is a usage error.
func parseAndValidate(fs *flag.FlagSet, args []string, lookup cliflag.Lookup, validators ...func() error) error {
	if err := cliflag.Parse(fs, args, lookup); err != nil {
		return usageErr(err)
	}
	for _, v := range validators {
		if err := v(); err != nil {
			return err
		}
	}
	return nil
}

// reachWait is how long the one-shot commands (status, errors, plan) wait
// for NATS or the Kubernetes API server before they give up and say why:
// long enough for a server that is starting, short enough that a wrong
// address is reported while the user still looks.
const reachWait = 5 * time.Second

// asUsage marks validate's error as a usage error.
func asUsage(validate func() error) func() error {
	return func() error {
		if err := validate(); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return nil
	}
}
