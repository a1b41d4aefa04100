package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// SchemaVersion is the envelope schema this build writes and accepts.
// An event with any other "schema" value is rejected with ErrUnknownSchema.
const SchemaVersion = 1

// Type names what an event carries; it picks the Go type of Envelope.Data.
type Type string

// Event and job types. The names follow the CloudEvents reverse-DNS style.
const (
	TypeInstanceAppeared Type = "io.matbus.instance.appeared" // data: Instance
	TypeInstanceGone     Type = "io.matbus.instance.gone"     // data: Instance
	TypeSyncJob          Type = "io.matbus.job.sync"          // data: SyncJob
	TypeCleanupJob       Type = "io.matbus.job.cleanup"       // data: CleanupJob
	TypeDeleteJob        Type = "io.matbus.job.delete"        // data: DeleteJob
	TypeError            Type = "io.matbus.error"             // data: Error
	TypeSyncResult       Type = "io.matbus.sync.result"       // data: SyncResult
)

// Sentinel errors of Decode and Envelope.Into; callers tell them apart with errors.Is.
var (
	ErrMalformed     = errors.New("events: malformed event")
	ErrUnknownSchema = errors.New("events: unknown schema version")
	ErrUnknownType   = errors.New("events: unknown event type")
	ErrWrongType     = errors.New("events: unexpected event type")
)

// Envelope is the JSON object every matbus message carries. The attribute
// names follow CloudEvents (id, source, type, time) plus "schema", the
// matbus envelope version. Data holds the type-specific payload.
type Envelope struct {
	Schema int       `json:"schema"`
	Type   Type      `json:"type"`
	ID     string    `json:"id"`
	Time   time.Time `json:"time"`
	Source string    `json:"source"`
	// Epoch is the discovery leader's term that published the event; nil
	// for events of other senders and of releases without fencing (see
	// Epoch).
	Epoch *Epoch          `json:"epoch,omitempty"`
	Data  json.RawMessage `json:"data"`
}

// Epoch names one term of a discovery leader: Lease is the
// "<namespace>/<name>" of the coordination.k8s.io Lease it was elected
// on, Term the Lease's leaseTransitions when the term began (it grows by
// one with every change of holder), Leader the holder identity. Instance
// events, sync and clean-up jobs of a leader-elected publisher carry it; a
// receiver that has seen a message of a higher Term on the same Lease
// refuses messages of lower ones (a deposed leader's). Messages without an
// epoch (older releases, a single publisher without leader election,
// workers' own clean-up jobs) are always accepted.
type Epoch struct {
	Lease  string `json:"lease"`
	Term   int64  `json:"term"`
	Leader string `json:"leader"`
}

// String returns "<lease>#<term>/<leader>", e.g. "mat/matbus-discovery#7/discovery-0".
func (e *Epoch) String() string {
	if e == nil {
		return "none"
	}
	return e.Lease + "#" + strconv.FormatInt(e.Term, 10) + "/" + e.Leader
}

// Before reports whether e is of an older term than o on the same Lease;
// a nil epoch is before nothing and nothing is before it.
func (e *Epoch) Before(o *Epoch) bool {
	return e != nil && o != nil && e.Lease == o.Lease && e.Term < o.Term
}

// Instance is a discovered MAT instance: the payload of appeared and gone events.
type Instance struct {
	// Key is "<namespace>.<name>" of the discovered Service (or static entry).
	Key string `json:"key"`
	// URL is the base URL of the instance's MAT API (e.g. "https://10.0.0.5:1266").
	URL string `json:"url"`
	// PodName is set for instances of multi-pod deployments.
	PodName string `json:"pod_name,omitempty"`
	// Owner is the name of the MAT Deployment in the instance's namespace
	// (the discovered Service name without "-bmc-mock"); "" when there is none.
	Owner string `json:"owner,omitempty"`
	// Scope names the discovery source that reported the instance (e.g.
	// "k8s:mat-system:nvidia-infra-controller/mat-service=true" or "static:dev").
	// A publisher only ever reports instances of its own scope as gone.
	Scope string `json:"scope"`
	// Version changes whenever the source's object changes (Kubernetes
	// resourceVersion, or a content hash for static sources).
	Version string `json:"version,omitempty"`
}

// Sync job reasons. A ReasonPoll job may end early when the status is
// unchanged since the worker's last complete sync of the instance; every
// other reason is a full resync (fetch, plan, apply).
const (
	ReasonPoll     = "poll"     // short-interval poll: skip when unchanged
	ReasonResync   = "resync"   // periodic full resync (every sync interval)
	ReasonAppeared = "appeared" // the instance is new or changed
	ReasonStart    = "start"    // a publisher took the lead
	ReasonProbe    = "probe"    // an instance out of rotation is tried again
)

// SyncJob asks one worker to converge the Services of one instance.
type SyncJob struct {
	Key string `json:"key"`
	// Reason is one of the Reason* constants ("tick" from older
	// publishers is a full resync too).
	Reason string `json:"reason"`
}

// Full reports whether the job asks for a full resync: any reason but
// ReasonPoll.
func (j SyncJob) Full() bool { return j.Reason != ReasonPoll }

// Sync outcomes carried in SyncResult.Outcome.
const (
	OutcomeSynced      = "synced"       // fetched, planned and applied; every write succeeded
	OutcomeUnchanged   = "unchanged"    // poll: status and Services unchanged, nothing planned
	OutcomeFetchFailed = "fetch-failed" // the status could not be fetched or decoded; nothing changed
	OutcomeApplyFailed = "apply-failed" // fetched and planned, but some write failed
	OutcomeSkipped     = "skipped"      // the instance is not present (gone or unknown)
	// OutcomeRetry is no job's result (JobID is empty): a worker's hint
	// that the cause of the instance's failed fetches may be gone (the
	// MAT CA bundle it verifies with changed since it refused the
	// instance's certificate). The scheduler probes a failing instance
	// at once instead of at its backoff; older schedulers ignore it.
	OutcomeRetry = "retry"
)

// SyncResult is what a worker reports after each sync job, on
// Subjects.Result(key) (core NATS). The discovery scheduler uses it to
// release the instance for its next job and to back off failing instances.
type SyncResult struct {
	Key string `json:"key"`
	// JobID is the envelope id of the sync job ("" with OutcomeRetry).
	JobID string `json:"job_id"`
	// Outcome is one of the Outcome* constants.
	Outcome string `json:"outcome"`
	// Error is the cause of a failure, "" otherwise.
	Error string `json:"error,omitempty"`
	// Transient is true when a failure may go away by itself.
	Transient bool `json:"transient,omitempty"`
	// DurationMS is how long the job ran, in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// Worker names the worker that ran the job.
	Worker string `json:"worker,omitempty"`
	// NotModified is true when MAT's strong ETag vouched that the status
	// is the one of the worker's last sync: a poll answered 304 Not
	// Modified with nothing to do (outcome unchanged), or a full sync
	// whose body came with the ETag and bytes held before. It is never
	// true for a MAT that sends no strong ETag or answers no condition.
	// The scheduler polls an instance whose polls keep being answered 304
	// at a stretched interval (ADR 23). Absent (false) in results of
	// older workers; older schedulers ignore it.
	NotModified bool `json:"not_modified,omitempty"`
}

// Failed reports whether the outcome is a failure.
func (r SyncResult) Failed() bool {
	return r.Outcome == OutcomeFetchFailed || r.Outcome == OutcomeApplyFailed
}

// CleanupJob asks one worker to fan out delete jobs for every Service of an
// instance that is gone.
type CleanupJob struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
}

// DeleteReason says why a delete job was published.
type DeleteReason string

// Delete job reasons.
const (
	// DeleteStale: the device is gone from the instance's status; the job
	// is re-checked against a status fetched after its PlannedAt.
	DeleteStale DeleteReason = "stale"
	// DeleteGone: the instance is gone; the job does nothing while the
	// instance is present again.
	DeleteGone DeleteReason = "gone"
)

// DeleteJob asks one worker to delete one Service.
type DeleteJob struct {
	// Key is the instance the Service belongs to.
	Key string `json:"key"`
	// Namespace and Name locate the Service.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// UID is sent as the delete precondition: a Service re-created under
	// the same name has another UID and is never removed by this job.
	UID string `json:"uid"`
	// MatID is the device the Service was built for, "" when unknown.
	MatID string `json:"mat_id,omitempty"`
	// Reason is DeleteStale or DeleteGone.
	Reason DeleteReason `json:"reason"`
	// PlannedAt is when the sync that found the Service stale fetched the
	// status it planned from (zero for "gone" and for older publishers).
	// A "stale" delete is re-checked against a status fetched after it.
	PlannedAt time.Time `json:"planned_at,omitzero"`
}

// ErrorKind is the last token of an error subject.
type ErrorKind string

// Kinds of error events (subject <prefix>.errors.<kind>).
const (
	ErrorDelete    ErrorKind = "delete"
	ErrorFetch     ErrorKind = "fetch"
	ErrorCreate    ErrorKind = "create"
	ErrorUpdate    ErrorKind = "update"
	ErrorClose     ErrorKind = "close"
	ErrorEvent     ErrorKind = "event"
	ErrorDiscovery ErrorKind = "discovery"
	ErrorPlan      ErrorKind = "plan"
	// ErrorWatch: an informer's list or watch calls started failing (the
	// process is not ready), or work again; one event for each.
	ErrorWatch ErrorKind = "watch"
	// ErrorHold: a worker holds an instance's deletes for a confirmation
	// window (many devices vanished at once), lets them run after it, or
	// (Resolved) the hold ended.
	ErrorHold ErrorKind = "hold"
)

// ErrorKinds lists every ErrorKind.
var ErrorKinds = []ErrorKind{ErrorDelete, ErrorFetch, ErrorCreate, ErrorUpdate, ErrorClose, ErrorEvent, ErrorDiscovery, ErrorPlan, ErrorWatch, ErrorHold}

// Error is the payload of an error event: one failure, with enough context
// for an operator to find the instance, Service or message involved.
type Error struct {
	Kind     ErrorKind `json:"kind"`
	Instance string    `json:"instance,omitempty"`
	URL      string    `json:"url,omitempty"`
	Service  string    `json:"service,omitempty"` // "<namespace>/<name>"
	MatID    string    `json:"mat_id,omitempty"`
	Subject  string    `json:"subject,omitempty"` // the message subject that failed, for event errors
	Message  string    `json:"message"`
	// Permanent is true when retrying cannot help (403, invalid object, bad payload).
	Permanent bool `json:"permanent"`
	// Attempts is how many tries were made (deliveries or backoff attempts).
	Attempts int `json:"attempts,omitempty"`
	// Suppressed counts earlier events of the same kind and target that
	// were not published because of the rate limit.
	Suppressed int `json:"suppressed,omitempty"`
	// Worker names the process that saw the failure.
	Worker string `json:"worker,omitempty"`
	// Resolved is true on the event that reports the end of a failure
	// state (for kind watch: list and watch work again); Message says how
	// long it lasted. Absent (false) on every failure.
	Resolved bool `json:"resolved,omitempty"`
}

// Decode parses one message body into an Envelope. It returns an error
// wrapping ErrMalformed for invalid JSON, trailing data or missing
// attributes, ErrUnknownSchema for a schema version other than
// SchemaVersion, and ErrUnknownType for a type this build does not know.
func Decode(body []byte) (Envelope, error) {
	var env Envelope
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&env); err != nil {
		return Envelope{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return Envelope{}, fmt.Errorf("%w: trailing data after the JSON object", ErrMalformed)
	}
	if env.Schema != SchemaVersion {
		return Envelope{}, fmt.Errorf("%w: %d (this build reads %d)", ErrUnknownSchema, env.Schema, SchemaVersion)
	}
	switch env.Type {
	case TypeInstanceAppeared, TypeInstanceGone, TypeSyncJob, TypeCleanupJob, TypeDeleteJob, TypeError, TypeSyncResult:
	case "":
		return Envelope{}, fmt.Errorf("%w: no type", ErrMalformed)
	default:
		return Envelope{}, fmt.Errorf("%w: %q", ErrUnknownType, env.Type)
	}
	if env.ID == "" {
		return Envelope{}, fmt.Errorf("%w: no id", ErrMalformed)
	}
	if len(env.Data) == 0 || string(env.Data) == "null" {
		return Envelope{}, fmt.Errorf("%w: no data", ErrMalformed)
	}
	if e := env.Epoch; e != nil && (e.Lease == "" || e.Term < 0 || e.Leader == "") {
		return Envelope{}, fmt.Errorf("%w: epoch needs a lease, a term >= 0 and a leader", ErrMalformed)
	}
	return env, nil
}

// Encode builds the envelope for data and marshals it. id must be unique per
// event (it becomes the JetStream Nats-Msg-Id); source names the sender.
func Encode(typ Type, id, source string, now time.Time, data any) ([]byte, error) {
	return EncodeEpoch(typ, id, source, now, nil, data)
}

// EncodeEpoch is Encode with the leader's epoch in the envelope (nil: none).
func EncodeEpoch(typ Type, id, source string, now time.Time, epoch *Epoch, data any) ([]byte, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("events: encode %s data: %w", typ, err)
	}
	return json.Marshal(Envelope{Schema: SchemaVersion, Type: typ, ID: id, Time: now.UTC(), Source: source, Epoch: epoch, Data: raw})
}

// validator is implemented by payload types that check their own fields.
type validator interface{ validate() error }

// Into decodes env.Data into T after checking that env.Type is one of want.
// It returns an error wrapping ErrWrongType or ErrMalformed (bad data or
// invalid fields, e.g. a key that is not "<namespace>.<name>").
func Into[T any](env Envelope, want ...Type) (T, error) {
	var v T
	ok := len(want) == 0
	for _, w := range want {
		ok = ok || env.Type == w
	}
	if !ok {
		return v, fmt.Errorf("%w: got %q, want %v", ErrWrongType, env.Type, want)
	}
	dec := json.NewDecoder(bytes.NewReader(env.Data))
	if err := dec.Decode(&v); err != nil {
		return v, fmt.Errorf("%w: %s data: %v", ErrMalformed, env.Type, err)
	}
	if val, ok := any(&v).(validator); ok {
		if err := val.validate(); err != nil {
			return v, fmt.Errorf("%w: %s data: %v", ErrMalformed, env.Type, err)
		}
	}
	return v, nil
}

func (i *Instance) validate() error {
	if err := ValidateKey(i.Key); err != nil {
		return err
	}
	if i.Scope == "" {
		return errors.New("instance has no scope")
	}
	return ValidateURL(i.URL)
}

// ValidateURL checks a MAT base URL as carried in events: absolute http or
// https with a host, a port (when given) in 1..65535, and no user info,
// query or fragment. Errors name the URL without its user info, query or
// fragment, which may hold credentials.
func ValidateURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url %q: not a URL", safeURL(raw))
	}
	shown := safeURL(raw)
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("url %q: scheme must be http or https", shown)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return fmt.Errorf("url %q: needs a host and no user info, query or fragment", shown)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("url %q: port %s is not in 1..65535", shown, p)
		}
	}
	return nil
}

// safeURL returns raw without user info, query and fragment (each replaced
// by a marker), for error messages.
func safeURL(raw string) string {
	s := raw
	marker := ""
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s, marker = s[:i], "?…"
	}
	if i := strings.Index(s, "://"); i >= 0 {
		rest := s[i+3:]
		host := rest
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			host = rest[:j]
		}
		if k := strings.LastIndexByte(host, '@'); k >= 0 {
			s = s[:i+3] + "***@" + rest[k+1:]
		}
	} else if k := strings.LastIndexByte(s, '@'); k >= 0 {
		s = "***@" + s[k+1:]
	}
	return s + marker
}

func (j *SyncJob) validate() error    { return ValidateKey(j.Key) }
func (r *SyncResult) validate() error { return ValidateKey(r.Key) }
func (j *CleanupJob) validate() error { return ValidateKey(j.Key) }

func (j *DeleteJob) validate() error {
	if err := ValidateKey(j.Key); err != nil {
		return err
	}
	if j.Namespace == "" || j.Name == "" || j.UID == "" {
		return errors.New("delete job needs namespace, name and uid")
	}
	return nil
}

func (e *Error) validate() error {
	if e.Kind == "" || e.Message == "" {
		return errors.New("error event needs kind and message")
	}
	return nil
}
