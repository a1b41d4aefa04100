package events

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/matbus/matbus/internal/redact"
)

// Reporter turns failures into a log line and an error event on
// <prefix>.errors.<kind>. Events for the same kind, target (instance,
// Service, URL, subject) and cause (the message without its digits, so a
// changed cause is published at once) are rate limited to one per Window; the next one
// published carries the count of those suppressed. Logging never waits on
// NATS: a failed publish is logged and dropped.
//
// No secret and no field of unbounded size leaves a Reporter: the user info
// of URLs is stripped from every text field (redact.StripUserInfo), the logger's
// Redactor (when its handler is one) is applied to them, and they are cut to
// MaxErrorMessage / MaxErrorField bytes, and further until the event fits
// the server's max_payload (Bus.MaxEventBytes), with TruncatedMarker.
type Reporter struct {
	bus    *Bus
	log    *slog.Logger
	redact func(string) string
	worker string
	window time.Duration
	now    func() time.Time

	mu         sync.Mutex
	last       map[string]*rateEntry
	reported   map[ErrorKind]int64
	suppressed map[ErrorKind]int64
}

// Stats returns how many failures of each kind were reported since
// NewReporter (every Report call), and how many of them the rate limit
// kept from being published.
func (r *Reporter) Stats() (reported, suppressed map[ErrorKind]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.reported), maps.Clone(r.suppressed)
}

// Redactor removes secrets from text. A Reporter whose logger's handler
// implements it applies it to every text field of an error event, so what
// the log would hide is not published either.
type Redactor interface {
	Redact(s string) string
}

type rateEntry struct {
	at         time.Time
	suppressed int
}

// NewReporter returns a Reporter publishing through bus (nil: log only).
// worker names this process in every event; window is the rate-limit
// window per target (0 means 30 s, negative disables the limit).
func NewReporter(bus *Bus, log *slog.Logger, worker string, window time.Duration) *Reporter {
	if window == 0 {
		window = 30 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clean := redact.StripUserInfo
	if rd, ok := log.Handler().(Redactor); ok {
		clean = func(s string) string { return redact.StripUserInfo(rd.Redact(s)) }
	}
	return &Reporter{bus: bus, log: log, redact: clean, worker: worker, window: window, now: time.Now, last: map[string]*rateEntry{},
		reported: map[ErrorKind]int64{}, suppressed: map[ErrorKind]int64{}}
}

// redactFields redacts every text field of e.
func (r *Reporter) redactFields(e Error) Error {
	for _, f := range []*string{&e.Message, &e.Instance, &e.URL, &e.Service, &e.MatID, &e.Subject, &e.Worker} {
		*f = r.redact(*f)
	}
	return e
}

// Report logs e (warn level for close errors, info level with the message
// "recovered" for a Resolved event, error level otherwise) and
// publishes it unless the rate limit suppresses it. It reports whether the
// event was published. Both the log line and the event carry e's fields
// redacted and cut as the Reporter's doc says. The publish uses its own 5 s
// timeout, detached from ctx's cancellation so a failure seen during
// shutdown is still recorded.
func (r *Reporter) Report(ctx context.Context, e Error) bool {
	if e.Worker == "" {
		e.Worker = r.worker
	}
	full := r.redactFields(e)
	e = full.capFields(MaxErrorMessage, MaxErrorField)
	level, msg := slog.LevelError, "failure"
	switch {
	case e.Resolved:
		level, msg = slog.LevelInfo, "recovered"
	case e.Kind == ErrorClose:
		level = slog.LevelWarn
	}
	r.log.Log(ctx, level, msg, "kind", e.Kind, "instance", e.Instance, "service", e.Service,
		"url", e.URL, "subject", e.Subject, "permanent", e.Permanent, "attempts", e.Attempts, "error", e.Message)

	key := string(e.Kind) + "|" + e.Instance + "|" + e.Service + "|" + e.URL + "|" + e.Subject + "|" + cause(e.Message)
	now := r.now()
	r.mu.Lock()
	r.reported[e.Kind]++
	ent := r.last[key]
	if r.window > 0 && ent != nil && now.Sub(ent.at) < r.window {
		ent.suppressed++
		r.suppressed[e.Kind]++
		r.mu.Unlock()
		return false
	}
	if ent == nil {
		ent = &rateEntry{}
		r.last[key] = ent
	}
	e.Suppressed, ent.suppressed, ent.at = ent.suppressed, 0, now
	// Forget old entries now and then so the map stays small.
	if len(r.last) > 4096 {
		for k, v := range r.last {
			if now.Sub(v.at) > r.window {
				delete(r.last, k)
			}
		}
	}
	r.mu.Unlock()

	if r.bus == nil {
		return false
	}
	id := "err-" + nuid.Next()
	full.Suppressed = e.Suppressed
	body, err := fitError(full, r.bus.MaxEventBytes(), r.bus.encodeError(id))
	if err != nil {
		r.log.Warn("error event not published", "kind", e.Kind, "error", err)
		return false
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.bus.PublishRaw(pctx, r.bus.subjects.Error(e.Kind), id, body); err != nil {
		r.log.Warn("error event not published", "kind", e.Kind, "error", err)
		return false
	}
	return true
}

// cause reduces a message to its shape: digits dropped (counts, ports,
// attempts, times) and at most 240 bytes kept.
func cause(msg string) string {
	b := make([]byte, 0, min(len(msg), 240))
	for i := 0; i < len(msg) && len(b) < 240; i++ {
		if msg[i] < '0' || msg[i] > '9' {
			b = append(b, msg[i])
		}
	}
	return string(b)
}
