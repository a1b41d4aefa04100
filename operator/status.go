package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/redact"
	"github.com/matbus/matbus/plan"
)

// StatusConfig is what ReadStatus reads from.
type StatusConfig struct {
	// Bus reads the instances stream, the state bucket, the error stream
	// and the job consumers; its Config().Namespace is the pipeline's
	// namespace (required).
	Bus *events.Bus
	// Kube, when set, lists the Services of the namespace once (label
	// ManagedBy and matbus.io/instance) to count each instance's BMC and
	// NVOS Services; nil leaves them unknown.
	Kube      kubernetes.Interface
	ManagedBy string
	// KubeErr is why Kube is nil (named in Summary.Unknown).
	KubeErr error
	// SourcesURL, when set, is the base URL of a discovery replica's
	// sources API (e.g. "http://127.0.0.1:8090"); GET <SourcesURL>/v1/sources
	// tells which instances it publishes. "" leaves that unknown.
	SourcesURL string
	// HTTP is the client of the sources API; nil means one with a 5 s timeout.
	HTTP *http.Client
	// ErrorsSince is how far back the error stream is read for each
	// instance's last error; 0 means 1 h.
	ErrorsSince time.Duration
}

// Status is the answer of ReadStatus: one row per present instance, sorted
// by key, and the pipeline's summary.
type Status struct {
	// Time is when it was read; the ages of the text form are relative to it.
	Time      time.Time   `json:"time"`
	Namespace string      `json:"namespace"`
	Rows      []StatusRow `json:"instances"`
	Summary   Summary     `json:"summary"`
}

// StatusRow is one instance.
type StatusRow struct {
	Instance string `json:"instance"`
	URL      string `json:"url"`
	// State is the discovery leader's view (rotation, intervals, last good
	// sync, worker); nil when the leader has not written it (no leader, or
	// the instance is newer than its last write).
	State *events.InstanceState `json:"state"`
	// Services counts the instance's Services by kind; nil when unknown.
	Services *ServiceCount `json:"services"`
	// LastError is the instance's latest error event within
	// StatusConfig.ErrorsSince; nil when none.
	LastError *ErrorSummary `json:"last_error"`
	// Published is whether the sources API lists the instance; nil when
	// not asked or not answered.
	Published *bool `json:"published"`
	// Hold is the instance's hold of deletes (the state bucket's hold
	// record); nil when none.
	Hold *HoldSummary `json:"hold"`
}

// HoldSummary is a hold of an instance's deletes (events.HoldRecord
// without its list of Services).
type HoldSummary struct {
	// Reason is all, share or epoch; Detail says it for people.
	Reason string `json:"reason"`
	Detail string `json:"detail"`
	// Held is how many Service deletes are held (or, once Released, being
	// done); Existing how many Services the instance had when it started.
	Held     int       `json:"held"`
	Existing int       `json:"existing"`
	Since    time.Time `json:"since"`
	Until    time.Time `json:"until"`
	// Released is when the window ended with the devices still away and
	// the deletes went ahead; zero while the hold is in force.
	Released time.Time `json:"released,omitzero"`
	Epoch    string    `json:"epoch,omitempty"`
}

// holdSummary is r without its Services.
func holdSummary(r events.HoldRecord) *HoldSummary {
	return &HoldSummary{Reason: r.Reason, Detail: r.Detail, Held: r.Held, Existing: r.Existing, Since: r.Since, Until: r.Until,
		Released: r.Released, Epoch: r.Epoch}
}

// ServiceCount is how many Services of an instance exist, by kind.
type ServiceCount struct {
	BMC  int `json:"bmc"`
	NVOS int `json:"nvos"`
}

// ErrorSummary is one error event.
type ErrorSummary struct {
	Kind      events.ErrorKind `json:"kind"`
	Time      time.Time        `json:"time"`
	Message   string           `json:"message"`
	Permanent bool             `json:"permanent"`
}

// Summary is the pipeline as a whole.
type Summary struct {
	Instances int `json:"instances"`
	// Services is the number of Services of present instances; -1 when unknown.
	Services  int              `json:"services"`
	Consumers []ConsumerStatus `json:"consumers"`
	// Leader is the discovery leader's entry of the state bucket; nil when
	// none. LeaderStale is true when it is older than three refreshes
	// (events.StateRefresh): no publisher has written it since. An entry
	// with Ended set is of a leader that stepped down then.
	Leader      *events.LeaderState `json:"leader"`
	LeaderStale bool                `json:"leader_stale,omitempty"`
	// StateStale is true when no leader is known to run (no leader entry,
	// or it is stale or ended): the rows' rotation and intervals are the
	// last a leader wrote, not the current scheduling.
	StateStale bool `json:"state_stale,omitempty"`
	// HeldDeletes is the number of Service deletes held now (holds in
	// force), over HeldInstances instances.
	HeldDeletes   int `json:"held_deletes"`
	HeldInstances int `json:"held_instances"`
	// Workers are the live workers' entries of the state bucket, oldest
	// epoch first: a worker standing by (Standby) takes no jobs because a
	// worker with another configuration started later (ADR 35). Entries
	// not rewritten for events.WorkerStale are left out.
	Workers []events.WorkerEntry `json:"workers"`
	// Unknown lists the parts that could not be read, and why.
	Unknown []string `json:"unknown,omitempty"`
}

// ConsumerStatus is one durable job consumer: jobs waiting for a worker
// (Pending) and jobs out with a worker (AckPending).
type ConsumerStatus struct {
	Name       string `json:"name"`
	Pending    uint64 `json:"pending"`
	AckPending int    `json:"ack_pending"`
}

// ErrNoPipeline is ReadStatus's error when the namespace has neither an
// instance record nor a discovery leader entry under the bus's subject
// prefix: no discovery has published there (often a --namespace or
// --subject-prefix other than the pipeline's).
var ErrNoPipeline = errors.New("no matbus pipeline")

// noPipeline returns ErrNoPipeline wrapped with the namespace and prefix
// looked in and the namespaces that do have instance records on this
// NATS, or why they are unknown.
func noPipeline(ctx context.Context, bus *events.Bus) error {
	ns, prefix := bus.Config().Namespace, bus.Subjects().Prefix
	if prefix == "" {
		prefix = events.DefaultPrefix
	}
	found, err := bus.InstanceNamespaces(ctx)
	var hint string
	switch {
	case err != nil:
		hint = "the namespaces that have one are unknown: " + err.Error()
	case len(found) == 0:
		hint = "no namespace has one on this NATS under that prefix: is discovery running against this NATS, with this --subject-prefix?"
	case len(found) == 1:
		hint = fmt.Sprintf("namespace %s has one on this NATS: give --namespace %s", found[0], found[0])
	default:
		hint = fmt.Sprintf("these namespaces have one on this NATS: %s (give one with --namespace)", strings.Join(found, ", "))
	}
	return fmt.Errorf("operator: %w in namespace %q (no instance record and no discovery leader under subject prefix %q); %s", ErrNoPipeline, ns, prefix, hint)
}

// ReadStatus reads the pipeline's status from what matbus publishes: the
// instances (last record per instance subject), the discovery leader's
// state bucket, the error stream of the last ErrorsSince, the job
// consumers' info, and, when configured, one LIST of Services and one GET
// of the sources API. No worker is asked. A part that cannot be read is
// named in Summary.Unknown and leaves its columns unknown; the error is
// only for the instances stream, without which there are no rows, and
// ErrNoPipeline when the namespace has no instance record and no leader.
func ReadStatus(ctx context.Context, cfg StatusConfig) (*Status, error) {
	bus := cfg.Bus
	ns := bus.Config().Namespace
	st := &Status{Time: time.Now(), Namespace: ns}
	recs, bad, err := bus.Instances(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("operator: %w (no discovery has started on this NATS with this subject prefix)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("operator: %w", err)
	}
	sum := &st.Summary
	for _, k := range bad {
		sum.Unknown = append(sum.Unknown, "instance record "+k+": does not decode")
	}
	for k, r := range recs {
		if r.Present() {
			st.Rows = append(st.Rows, StatusRow{Instance: k, URL: r.Instance.URL})
		}
	}
	slices.SortFunc(st.Rows, func(a, b StatusRow) int { return strings.Compare(a.Instance, b.Instance) })
	sum.Instances = len(st.Rows)

	states, leader, err := bus.ReadState(ctx, ns)
	if err != nil {
		sum.Unknown = append(sum.Unknown, "state: "+err.Error())
	}
	if len(recs) == 0 && len(bad) == 0 && leader == nil && (err == nil || errors.Is(err, events.ErrNoState)) {
		return nil, noPipeline(ctx, bus)
	}
	sum.Leader = leader
	sum.LeaderStale = leader != nil && st.Time.Sub(leader.Updated) > 3*events.StateRefresh
	sum.StateStale = leader == nil || sum.LeaderStale || !leader.Ended.IsZero()
	holds, err := bus.ReadHolds(ctx, ns)
	if err != nil && !errors.Is(err, events.ErrNoState) {
		sum.Unknown = append(sum.Unknown, "holds: "+err.Error())
	}
	workers, err := bus.ReadWorkers(ctx, ns)
	if err != nil && !errors.Is(err, events.ErrNoState) {
		sum.Unknown = append(sum.Unknown, "workers: "+err.Error())
	}
	for _, w := range workers {
		if st.Time.Sub(w.Stored) < events.WorkerStale {
			sum.Workers = append(sum.Workers, w)
		}
	}
	errs, err := lastErrors(ctx, bus, ns, cfg.ErrorsSince)
	if err != nil {
		sum.Unknown = append(sum.Unknown, "errors: "+err.Error())
	}
	var services map[string]ServiceCount
	if cfg.KubeErr != nil {
		sum.Unknown = append(sum.Unknown, "Services: "+cfg.KubeErr.Error())
	}
	if cfg.Kube != nil {
		if services, err = countServices(ctx, cfg.Kube, ns, cfg.ManagedBy); err != nil {
			sum.Unknown = append(sum.Unknown, "Services: "+err.Error())
		}
	}
	var published map[string]bool
	if cfg.SourcesURL != "" {
		if published, err = sourceNames(ctx, cfg.HTTP, cfg.SourcesURL); err != nil {
			sum.Unknown = append(sum.Unknown, "sources API: "+err.Error())
		}
	}
	st.fillRows(rowSources{states: states, errs: errs, holds: holds, services: services, published: published})
	st.readConsumers(ctx, bus)
	return st, nil
}

// rowSources are the per-instance readings ReadStatus joins into its rows,
// each keyed by instance key (services by its label value); a nil map is a
// source that was not read.
type rowSources struct {
	states    map[string]events.InstanceState
	errs      map[string]ErrorSummary
	holds     map[string]events.HoldRecord
	services  map[string]ServiceCount
	published map[string]bool
}

// fillRows joins src into st's rows and totals the held deletes and the
// Services in st's summary (Services is -1 when they were not counted).
func (st *Status) fillRows(src rowSources) {
	st.Summary.Services = -1
	if src.services != nil {
		st.Summary.Services = 0
	}
	for i := range st.Rows {
		r := &st.Rows[i]
		if s, ok := src.states[r.Instance]; ok {
			r.State = &s
		}
		if e, ok := src.errs[r.Instance]; ok {
			r.LastError = &e
		}
		if h, ok := src.holds[r.Instance]; ok {
			r.Hold = holdSummary(h)
			if h.InForce() {
				st.Summary.HeldDeletes += h.Held
				st.Summary.HeldInstances++
			}
		}
		if src.services != nil {
			c := src.services[plan.LabelValue(r.Instance)]
			r.Services = &c
			st.Summary.Services += c.BMC + c.NVOS
		}
		if src.published != nil {
			_, name, _ := strings.Cut(r.Instance, ".")
			p := src.published[name]
			r.Published = &p
		}
	}
}

// readConsumers adds the job consumers' backlogs to st's summary; a consumer
// that cannot be read is listed under Unknown.
func (st *Status) readConsumers(ctx context.Context, bus *events.Bus) {
	for _, role := range []string{events.SyncConsumer, events.DeleteConsumer} {
		info, err := bus.ConsumerInfo(ctx, role)
		if err != nil {
			st.Summary.Unknown = append(st.Summary.Unknown, err.Error())
			continue
		}
		st.Summary.Consumers = append(st.Summary.Consumers, ConsumerStatus{Name: info.Name, Pending: info.NumPending, AckPending: info.NumAckPending})
	}
}

// lastErrors reads the error events of the last since (0: 1 h) and returns
// the latest per instance of namespace ns (every namespace when empty).
func lastErrors(ctx context.Context, bus *events.Bus, ns string, since time.Duration) (map[string]ErrorSummary, error) {
	if since <= 0 {
		since = time.Hour
	}
	start := time.Now().Add(-since)
	cons, err := bus.OrderedConsumer(ctx, events.StreamErrors, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.Subjects().Errors()}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
		InactiveThreshold: consumerInactive})
	if err != nil {
		return nil, fmt.Errorf("read the error stream: %w", err)
	}
	defer bus.DropConsumer(ctx, events.StreamErrors, cons)
	out := map[string]ErrorSummary{}
	pending := cons.CachedInfo().NumPending
	if pending == 0 {
		return out, nil
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("read the error stream: %w", err)
	}
	defer it.Stop()
	for read := uint64(0); read < pending; read++ {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return out, fmt.Errorf("read the error stream (%d of %d events): %w", read, pending, err)
		}
		env, err := events.Decode(m.Data())
		if err != nil {
			continue
		}
		e, err := events.Into[events.Error](env, events.TypeError)
		if err != nil || e.Instance == "" || e.Resolved || ns != "" && !strings.HasPrefix(e.Instance, ns+".") {
			continue // a Resolved event ends a failure: it is not the last error
		}
		out[e.Instance] = ErrorSummary{Kind: e.Kind, Time: env.Time, Message: e.Message, Permanent: e.Permanent}
	}
	return out, nil
}

// countServices lists the Services of ns labelled managed-by managedBy
// and matbus.io/instance once and counts them per instance label value:
// NVOS for those with the NVOS IP annotation, BMC for the others.
func countServices(ctx context.Context, kube kubernetes.Interface, ns, managedBy string) (map[string]ServiceCount, error) {
	list, err := kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{
		LabelSelector: plan.LabelManagedBy + "=" + managedBy + "," + plan.LabelInstance})
	if err != nil {
		return nil, err
	}
	out := map[string]ServiceCount{}
	for _, s := range list.Items {
		c := out[s.Labels[plan.LabelInstance]]
		if s.Annotations[plan.AnnotationNVOSIP] != "" {
			c.NVOS++
		} else {
			c.BMC++
		}
		out[s.Labels[plan.LabelInstance]] = c
	}
	return out, nil
}

// sourceNames GETs the sources API document and returns the names it lists.
func sourceNames(ctx context.Context, c *http.Client, base string) (map[string]bool, error) {
	if c == nil {
		c = &http.Client{Timeout: 5 * time.Second}
	}
	// Errors name the URL without its user info and never quote a piece of
	// an unparsable one (redact.ParseURL).
	raw := strings.TrimSuffix(base, "/") + discovery.SourcesPath
	if _, err := redact.ParseURL(raw); err != nil {
		return nil, fmt.Errorf("invalid URL %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, errors.New(redact.StripUserInfo(err.Error()))
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, errors.New(redact.StripUserInfo(err.Error()))
	}
	defer resp.Body.Close()
	shown := redact.StripUserInfo(req.URL.Redacted())
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", shown, resp.Status)
	}
	var doc discovery.Sources
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("GET %s: %w", shown, err)
	}
	if !doc.Ready {
		return nil, errors.New("not ready (no discovery pass yet)")
	}
	out := make(map[string]bool, len(doc.List))
	for _, e := range doc.List {
		out[e.Name] = true
	}
	return out, nil
}

// WriteStatusJSON writes st as one indented JSON document. Errors: w's.
func WriteStatusJSON(w io.Writer, st *Status) error { return writeJSON(w, st, "status") }

// WriteStatusText writes st as a table, one row per instance (INSTANCE,
// URL, ROTATION with the poll or probe interval, LAST SYNC age, SERVICES
// as BMC/NVOS, HELD deletes with the time left or "deleting N" once
// released, LAST ERROR kind and age, WORKER, PUBLISHED), "-" for what
// is unknown, then the summary lines. With Summary.StateStale (no leader
// running) ROTATION is "?" with the last value written ("? (was in)");
// LAST SYNC and WORKER, being history, stay. A stale leader entry is
// shown with its age, an ended one as "no discovery leader (last: X,
// stepped down <age> ago)"; the leading time counts up only for a live
// leader.
func WriteStatusText(w io.Writer, st *Status) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tURL\tROTATION\tLAST SYNC\tSERVICES (BMC/NVOS)\tHELD\tLAST ERROR\tWORKER\tPUBLISHED")
	for _, r := range st.Rows {
		rot, last, worker := "-", "-", "-"
		if s := r.State; s != nil {
			switch {
			case st.Summary.StateStale && s.InRotation:
				rot = "? (was in)"
			case st.Summary.StateStale:
				rot = fmt.Sprintf("? (was OUT, %d failed)", s.FailedFetches)
			case s.InRotation:
				rot = "in (poll " + ms(s.PollIntervalMS) + ")"
			default:
				rot = fmt.Sprintf("OUT (probe %s, %d failed)", ms(s.ProbeIntervalMS), s.FailedFetches)
			}
			if !s.LastGoodSync.IsZero() {
				last = age(st.Time, s.LastGoodSync) + " ago"
			} else {
				last = "never"
			}
			if s.Worker != "" {
				worker = s.Worker
			}
		}
		svc := "-"
		if r.Services != nil {
			svc = fmt.Sprintf("%d/%d", r.Services.BMC, r.Services.NVOS)
		}
		lastErr := "-"
		if e := r.LastError; e != nil {
			lastErr = string(e.Kind) + " " + age(st.Time, e.Time) + " ago"
		}
		pub := "-"
		if r.Published != nil {
			pub = map[bool]string{true: "yes", false: "NO"}[*r.Published]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Instance, r.URL, rot, last, svc, heldText(st.Time, r.Hold), lastErr, worker, pub)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("operator: write status: %w", err)
	}
	s := st.Summary
	svc := "unknown"
	if s.Services >= 0 {
		svc = fmt.Sprint(s.Services)
	}
	var cons []string
	for _, c := range s.Consumers {
		cons = append(cons, fmt.Sprintf("%s %d pending, %d ack-pending", c.Name, c.Pending, c.AckPending))
	}
	if len(cons) == 0 {
		cons = []string{"consumers unknown"}
	}
	leader := "no discovery leader"
	switch l := s.Leader; {
	case l == nil:
	case !l.Ended.IsZero():
		leader = fmt.Sprintf("no discovery leader (last: %s, stepped down %s ago after leading %s)", l.Identity, age(st.Time, l.Ended), age(l.Ended, l.Since))
	case s.LeaderStale:
		leader = fmt.Sprintf("discovery leader %s STALE (written %s ago, leading %s then)", l.Identity, age(st.Time, l.Updated), age(l.Updated, l.Since))
	default:
		leader = fmt.Sprintf("discovery leader %s (leading %s, written %s ago)", l.Identity, age(st.Time, l.Since), age(st.Time, l.Updated))
	}
	fmt.Fprintf(w, "\n%s, %s Services; %s; %s\n", plural(s.Instances, "instance"), svc, strings.Join(cons, "; "), leader)
	if s.HeldInstances > 0 {
		fmt.Fprintf(w, "held deletes: %d Services of %s whose devices vanished at once; each is deleted only if its device is still away after the hold's window (matbus errors --kind hold)\n",
			s.HeldDeletes, plural(s.HeldInstances, "instance"))
	}
	if len(s.Workers) > 0 {
		fmt.Fprintf(w, "workers: %s\n", workersText(s.Workers))
	}
	for _, u := range s.Unknown {
		fmt.Fprintf(w, "unknown: %s\n", u)
	}
	return nil
}

// workersText is the workers line: each worker with its configuration's
// fingerprint, e.g. "matbus-worker-7d9 (config 3f9a0c21d4e7), matbus-
// worker-5c2 (config 81b2e07a9c10, STANDING BY for matbus-worker-7d9)".
func workersText(ws []events.WorkerEntry) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = fmt.Sprintf("%s (config %s", w.Name, w.Fingerprint)
		if w.Standby {
			parts[i] += ", STANDING BY for " + w.StandbyFor
		}
		parts[i] += ")"
	}
	return strings.Join(parts, ", ")
}

// heldText is the HELD cell of hold h at now: "-" for none, "400 (all,
// 4m12s left)" in force, "400 (all, window over 3s ago)" when its window is
// over and no status confirmed it yet, "deleting 400" once released.
func heldText(now time.Time, h *HoldSummary) string {
	switch {
	case h == nil:
		return "-"
	case !h.Released.IsZero():
		return fmt.Sprintf("deleting %d", h.Held)
	case now.Before(h.Until):
		return fmt.Sprintf("%d (%s, %s left)", h.Held, h.Reason, age(h.Until, now))
	}
	return fmt.Sprintf("%d (%s, window over %s ago)", h.Held, h.Reason, age(now, h.Until))
}

// consumerInactive is the InactiveThreshold of the ordered consumers that
// status and TailErrors read the error stream with (nats.go's default is
// 5 min): one left behind by a killed reader goes after it. An idle
// TailErrors --follow keeps its consumer: its waiting pull requests count
// as activity.
var consumerInactive = 10 * time.Second

// ms renders a millisecond count as a duration ("1s", "8s", "250ms").
func ms(v int64) string { return (time.Duration(v) * time.Millisecond).String() }

// age renders now - t rounded to the second (under a second: "0s").
func age(now, t time.Time) string {
	d := max(now.Sub(t), 0)
	return d.Round(time.Second).String()
}
