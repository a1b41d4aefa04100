package kuberate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
)

// Reason says why a Limiter lowered its limits.
type Reason string

// The reasons of a decrease, the label values of
// matbus_kube_rate_decreases_total.
const (
	// ReasonThrottled: a 429 Too Many Requests (API Priority and Fairness
	// rejected or timed out the request in its queue, or a proxy did).
	ReasonThrottled Reason = "throttled"
	// ReasonOverload: a 502, 503 or 504 (the API server or a proxy in
	// front of it is overloaded or timed the request out).
	ReasonOverload Reason = "overload"
	// ReasonLatency: a standing queue: even the fastest write of a
	// control period took more than Tolerance times its baseline.
	ReasonLatency Reason = "latency"
)

// ErrStopped is what Wait returns after Stop.
var ErrStopped = errors.New("kuberate: limiter stopped")

// Config are a Limiter's limits and tuning. Only MaxQPS is required; every
// other zero field takes the default its comment names.
type Config struct {
	// MaxQPS is the hard ceiling of the rate, in requests per second; the
	// rate never rises above it. Required, > 0.
	MaxQPS float64
	// InitialQPS is the rate at the start, requests/s (default MaxQPS,
	// capped at MaxQPS).
	InitialQPS float64
	// MinQPS is the rate no decrease goes below, requests/s (default
	// min(5, InitialQPS)).
	MinQPS float64
	// Burst is the token bucket's depth: requests sent at once above the
	// rate after a quiet spell (default max(1, InitialQPS)).
	Burst int
	// RateIncrease is how fast the rate rises while requests wait for
	// tokens and the API server neither pushes back nor slows down, in
	// requests/s per second (default MaxQPS: from 0 to the ceiling in 1 s).
	RateIncrease float64

	// MaxInFlight is the hard ceiling of requests in flight at once
	// (watches and other long-running requests are not counted; default 64).
	MaxInFlight int
	// InitialInFlight is the in-flight limit at the start (default
	// min(16, MaxInFlight)).
	InitialInFlight int
	// MinInFlight is the in-flight limit no decrease goes below
	// (default min(2, MaxInFlight)).
	MinInFlight int

	// Interval is the control period: each period that saw demand hit a
	// limit and no pushback raises that limit once (the rate by
	// RateIncrease × Interval; the in-flight limit, only when the latency
	// was within Tolerance, by doubling until its first decrease — slow
	// start, as TCP's congestion window — and by 1 after it); default
	// 100 ms.
	Interval time.Duration
	// Tolerance is the rise of write latency over its baseline that counts
	// as a standing queue in the API server: a period whose fastest write
	// (per HTTP method) took more than Tolerance × its method's baseline
	// lowers the in-flight limit (default 3). The fastest, not the mean,
	// as CoDel judges a queue by its minimum delay: a burst queues some
	// requests for a moment and a server that batches its commits answers
	// some late, while a standing queue delays every request.
	Tolerance float64
	// Backoff multiplies both limits on a 429 or 5xx (default 0.5).
	Backoff float64
	// LatencyBackoff multiplies the in-flight limit when latency rose
	// (default 0.8).
	LatencyBackoff float64
	// BaselineWindow is how far back (in time during which writes were
	// sent) the latency baseline, the minimum latency per HTTP method, is
	// taken from (default 2 min).
	BaselineWindow time.Duration
	// MaxPause caps the pause a Retry-After asks for (default 30 s).
	MaxPause time.Duration
	// Clock is the time source (default the real clock); tests pass a
	// fake one.
	Clock clock.Clock
}

// withDefaults returns c with every zero field set to its default, or an
// error when a value is out of range.
func (c Config) withDefaults() (Config, error) {
	if !(c.MaxQPS > 0) || math.IsInf(c.MaxQPS, 0) {
		return c, fmt.Errorf("kuberate: MaxQPS must be positive, got %v", c.MaxQPS)
	}
	if c.InitialQPS <= 0 || c.InitialQPS > c.MaxQPS {
		c.InitialQPS = c.MaxQPS
	}
	if c.MinQPS <= 0 {
		c.MinQPS = min(5, c.InitialQPS)
	}
	c.MinQPS = min(c.MinQPS, c.InitialQPS)
	if c.Burst <= 0 {
		c.Burst = max(1, int(c.InitialQPS))
	}
	if c.RateIncrease <= 0 {
		c.RateIncrease = c.MaxQPS
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 64
	}
	if c.InitialInFlight <= 0 {
		c.InitialInFlight = min(16, c.MaxInFlight)
	}
	c.InitialInFlight = min(c.InitialInFlight, c.MaxInFlight)
	if c.MinInFlight <= 0 {
		c.MinInFlight = min(2, c.MaxInFlight)
	}
	c.MinInFlight = min(c.MinInFlight, c.InitialInFlight)
	if c.Interval <= 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.Tolerance <= 0 {
		c.Tolerance = 3
	}
	if c.Tolerance <= 1 {
		return c, fmt.Errorf("kuberate: Tolerance must be above 1, got %v", c.Tolerance)
	}
	if c.Backoff <= 0 {
		c.Backoff = 0.5
	}
	if c.LatencyBackoff <= 0 {
		c.LatencyBackoff = 0.8
	}
	if c.Backoff >= 1 || c.LatencyBackoff >= 1 {
		return c, fmt.Errorf("kuberate: Backoff and LatencyBackoff must be below 1, got %v and %v", c.Backoff, c.LatencyBackoff)
	}
	if c.BaselineWindow <= 0 {
		c.BaselineWindow = 2 * time.Minute
	}
	if c.MaxPause <= 0 {
		c.MaxPause = 30 * time.Second
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return c, nil
}

// Limiter is an adaptive limit of one process's Kubernetes API requests:
// a token bucket (its rate between MinQPS and MaxQPS) that client-go waits
// on before each request, and a cap on requests in flight that its
// transport (Wrap) holds each request to until the response headers
// arrive. The transport reads every response: a 429 or 502/503/504 halves
// both limits (Backoff) and a Retry-After pauses every new request for that
// long; the latency of writes (POST, PUT, PATCH, DELETE; watches and other
// long-running requests are left out) against a windowed minimum per
// method lowers the in-flight limit when even the fastest write of a
// period took more than Tolerance times the baseline (a standing queue). Each limit rises once per Interval, only in periods in
// which demand hit it (a request waited for a token, or for a slot) and
// nothing pushed back; the in-flight limit also only while the latency is
// within Tolerance. The rate rises additively; the in-flight limit doubles
// until its first decrease (slow start: a client whose demand outgrows
// the initial limit reaches what the API server takes within a few
// periods, instead of one request more per period) and then rises by
// one. Latency lowers only the in-flight limit: with fewer requests in
// flight the rate achieved falls by Little's law. It also records the API
// Priority and Fairness flow schema and priority level the API server put
// the requests in (Stats).
//
// A Limiter implements flowcontrol.RateLimiter and is safe for concurrent
// use. It starts no goroutine: the control period is evaluated as
// requests pass.
type Limiter struct {
	cfg Config
	clk clock.Clock

	mu       sync.Mutex
	bucket   *rate.Limiter
	qps      float64   // current rate, requests/s
	paused   time.Time // no token before this (Retry-After)
	stopped  bool
	inflight int
	limit    float64 // in-flight limit (fractional: decreases multiply)
	// slowStart: no decrease yet, so the in-flight limit doubles per
	// saturated period instead of rising by 1.
	slowStart bool
	waiters   []chan struct{}

	period    period
	lastDown  time.Time // last decrease: samples of requests sent before it do not count
	baselines map[string]*minWindow

	decreases   map[Reason]int64
	pausedTotal time.Duration
	responses   map[apfKey]int64
	last        apfKey
	sent        int64
	lastRatio   float64
	lastRate    float64 // answers per second in the last control period
}

// period accumulates what one control period saw.
type period struct {
	start       time.Time
	rateWaited  bool                     // a request waited for a token
	slotWaited  bool                     // a request waited for an in-flight slot, or took the last one
	pushback    bool                     // a 429 or 5xx
	peak        int                      // most requests in flight at once
	done        int                      // requests answered
	minByMethod map[string]time.Duration // the fastest write answered, per method
}

// apfKey is the API Priority and Fairness classification of a response.
type apfKey struct{ FlowSchemaUID, PriorityLevelUID string }

// New returns a Limiter for cfg; it returns an error for an invalid cfg
// (MaxQPS not positive, Tolerance not above 1, a backoff not below 1).
func New(cfg Config) (*Limiter, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	now := cfg.Clock.Now()
	l := &Limiter{
		cfg: cfg, clk: cfg.Clock,
		qps:       cfg.InitialQPS,
		limit:     float64(cfg.InitialInFlight),
		slowStart: true,
		baselines: map[string]*minWindow{},
		decreases: map[Reason]int64{},
		responses: map[apfKey]int64{},
	}
	l.bucket = rate.NewLimiter(rate.Limit(cfg.InitialQPS), cfg.Burst)
	// The bucket starts full at now (x/time/rate measures from the first
	// reservation, which a fake clock's times must anchor).
	l.bucket.SetLimitAt(now, rate.Limit(cfg.InitialQPS))
	l.period.start = now
	return l, nil
}

// Apply makes cfg's clients use l: cfg.RateLimiter is l, and l's
// transport wraps whatever cfg.WrapTransport already wraps. cfg.QPS and
// cfg.Burst are then ignored by client-go.
func (l *Limiter) Apply(cfg *rest.Config) {
	cfg.RateLimiter = l
	cfg.Wrap(l.Wrap)
}

var _ flowcontrol.RateLimiter = (*Limiter)(nil)

// TryAccept takes a token if one is available now and no Retry-After
// pause is on; it never blocks.
func (l *Limiter) TryAccept() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	l.tick(now)
	if l.stopped || now.Before(l.paused) {
		return false
	}
	if !l.bucket.AllowN(now, 1) {
		l.period.rateWaited = true
		return false
	}
	l.sent++
	return true
}

// Accept waits for a token (see Wait), without a deadline.
func (l *Limiter) Accept() { _ = l.Wait(context.Background()) }

// Stop makes TryAccept false and Wait return ErrStopped from now on.
func (l *Limiter) Stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
}

// InFlightLimit is the current limit of requests in flight (watches and
// other long-running requests not counted), between MinInFlight and
// MaxInFlight. Callers that queue work for the API server (see
// worker.Config.KubeWindow) size their queues by it.
func (l *Limiter) InFlightLimit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tick(l.clk.Now())
	return l.slots()
}

// MaxInFlight is the in-flight limit's ceiling (Config.MaxInFlight).
func (l *Limiter) MaxInFlight() int { return l.cfg.MaxInFlight }

// QPS is the current rate, requests/s.
func (l *Limiter) QPS() float32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return float32(l.qps)
}

// Wait blocks until a Retry-After pause is over and a token is available,
// or ctx ends (its error is returned, wrapped). It returns ErrStopped
// after Stop.
func (l *Limiter) Wait(ctx context.Context) error {
	for {
		l.mu.Lock()
		now := l.clk.Now()
		l.tick(now)
		if l.stopped {
			l.mu.Unlock()
			return ErrStopped
		}
		if now.Before(l.paused) {
			d := l.paused.Sub(now)
			l.mu.Unlock()
			if err := l.sleep(ctx, d); err != nil {
				return err
			}
			continue
		}
		r := l.bucket.ReserveN(now, 1)
		d := r.DelayFrom(now)
		if d > 0 {
			l.period.rateWaited = true
		}
		l.sent++
		l.mu.Unlock()
		if d <= 0 {
			return nil
		}
		if err := l.sleep(ctx, d); err != nil {
			l.mu.Lock()
			r.CancelAt(l.clk.Now())
			l.sent--
			l.mu.Unlock()
			return err
		}
		return nil
	}
}

func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	t := l.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("kuberate: wait for the Kubernetes API rate limit: %w", ctx.Err())
	case <-t.C():
		return nil
	}
}

// acquire takes an in-flight slot, waiting while the limit is reached,
// or returns ctx's error (wrapped).
func (l *Limiter) acquire(ctx context.Context) error {
	l.mu.Lock()
	l.tick(l.clk.Now())
	if l.inflight < l.slots() && len(l.waiters) == 0 {
		l.inflight++
		l.period.peak = max(l.period.peak, l.inflight)
		if l.inflight >= l.slots() {
			l.period.slotWaited = true
		}
		l.mu.Unlock()
		return nil
	}
	l.period.slotWaited = true
	ch := make(chan struct{})
	l.waiters = append(l.waiters, ch)
	l.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, w := range l.waiters {
			if w == ch {
				l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
				return fmt.Errorf("kuberate: wait for a Kubernetes API request slot: %w", ctx.Err())
			}
		}
		// Granted meanwhile: give the slot back.
		l.inflight--
		l.grant()
		return fmt.Errorf("kuberate: wait for a Kubernetes API request slot: %w", ctx.Err())
	}
}

// release gives a slot back. l.mu must be held.
func (l *Limiter) release() {
	l.inflight--
	l.grant()
}

// grant hands free slots to waiters in arrival order. l.mu must be held.
func (l *Limiter) grant() {
	for len(l.waiters) > 0 && l.inflight < l.slots() {
		ch := l.waiters[0]
		l.waiters = l.waiters[1:]
		l.inflight++
		l.period.peak = max(l.period.peak, l.inflight)
		close(ch)
	}
}

// slots is the whole in-flight limit. l.mu must be held.
func (l *Limiter) slots() int { return max(1, int(l.limit)) }

// observation is one answered request, as the transport saw it.
type observation struct {
	method     string
	start      time.Time // slot taken
	latency    time.Duration
	status     int           // 0: no response (transport error)
	retryAfter time.Duration // from a Retry-After header; 0 without
	write      bool          // a latency sample (a write answered with 2xx)
	apf        apfKey
}

// observe records o and releases its slot.
func (l *Limiter) observe(o observation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	l.tick(now)
	l.release()
	l.period.done++
	if o.apf != (apfKey{}) {
		l.responses[o.apf]++
		l.last = o.apf
	}
	switch {
	case o.status == 429:
		l.pushback(now, ReasonThrottled, o.retryAfter)
	case o.status == 502 || o.status == 503 || o.status == 504:
		l.pushback(now, ReasonOverload, o.retryAfter)
	case o.write && !o.start.Before(l.lastDown):
		w := l.baselines[o.method]
		if w == nil {
			w = &minWindow{window: l.cfg.BaselineWindow}
			l.baselines[o.method] = w
		}
		if l.period.minByMethod == nil {
			l.period.minByMethod = map[string]time.Duration{}
		}
		if m, ok := l.period.minByMethod[o.method]; !ok || o.latency < m {
			l.period.minByMethod[o.method] = o.latency
		}
	}
}

// pushback handles a 429 or 5xx: a pause for its Retry-After and, unless
// the limits went down less than a period ago (the responses of requests
// already in flight then belong to the same congestion), a multiplicative
// decrease of both limits. l.mu must be held.
func (l *Limiter) pushback(now time.Time, why Reason, retryAfter time.Duration) {
	l.period.pushback = true
	afterPause := now.Sub(l.paused) < 2*l.cfg.Interval // a pause is on or just ended
	if retryAfter > 0 {
		until := now.Add(min(retryAfter, l.cfg.MaxPause))
		if until.After(l.paused) {
			l.pausedTotal += until.Sub(maxTime(now, l.paused))
			l.paused = until
		}
	}
	if now.Sub(l.lastDown) < l.cfg.Interval {
		return
	}
	// From what was used, not the limit alone: a limit far above the
	// demand would otherwise not bite. Right after a Retry-After pause the
	// rate achieved says nothing (the pause held it down): then from the
	// limit.
	from := l.qps
	if !afterPause {
		achieved := max(l.lastRate, float64(l.period.done)/max(now.Sub(l.period.start).Seconds(), l.cfg.Interval.Seconds()))
		from = min(from, max(achieved, l.cfg.MinQPS))
	}
	l.setQPS(now, from*l.cfg.Backoff)
	l.lowerInFlight(l.cfg.Backoff)
	l.decreases[why]++
	l.lastDown = now
}

func (l *Limiter) lowerInFlight(f float64) {
	l.slowStart = false
	used := float64(max(l.period.peak, l.inflight))
	l.limit = max(float64(l.cfg.MinInFlight), min(l.limit, max(used, 1))*f)
}

func (l *Limiter) setQPS(now time.Time, qps float64) {
	qps = min(max(qps, l.cfg.MinQPS), l.cfg.MaxQPS)
	if qps == l.qps {
		return
	}
	l.qps = qps
	l.bucket.SetLimitAt(now, rate.Limit(qps))
}

// tick ends the control period when Interval has passed: latency above
// Tolerance lowers the in-flight limit; otherwise each limit that demand
// hit, with no pushback, rises once. l.mu must be held.
func (l *Limiter) tick(now time.Time) {
	p := &l.period
	if now.Sub(p.start) < l.cfg.Interval {
		return
	}
	// A standing queue, as CoDel tells one: even the fastest write of the
	// period took more than Tolerance × its method's baseline. A burst
	// that queues some requests for a moment does not count, and neither
	// does a server that needs many requests in flight to be busy (etcd
	// batches its commits) as long as some of them are answered fast.
	slow := false
	if len(p.minByMethod) > 0 {
		ratio := 0.0
		for m, d := range p.minByMethod {
			base := l.baselines[m].min(d)
			ratio = max(ratio, float64(max(d, time.Microsecond))/float64(max(base, time.Microsecond)))
			l.baselines[m].add(now, d)
		}
		l.lastRatio = ratio
		slow = ratio > l.cfg.Tolerance
	}
	// The rate answers the server's explicit pushback; the in-flight
	// limit answers that and latency too (Little's law: with fewer
	// requests in flight the rate achieved falls as the latency rises, so
	// a rate cut on latency as well would cut twice).
	if !p.pushback && p.rateWaited && !now.Before(l.paused) {
		l.setQPS(now, l.qps+l.cfg.RateIncrease*l.cfg.Interval.Seconds())
	}
	switch {
	case p.pushback:
	case slow:
		if now.Sub(l.lastDown) >= l.cfg.Interval {
			l.lowerInFlight(l.cfg.LatencyBackoff)
			l.decreases[ReasonLatency]++
			l.lastDown = now
		}
	case p.slotWaited && l.limit < float64(l.cfg.MaxInFlight):
		next := math.Floor(l.limit) + 1
		if l.slowStart {
			next = 2 * math.Floor(l.limit)
		}
		l.limit = min(float64(l.cfg.MaxInFlight), next)
		l.grant()
	}
	l.lastRate = float64(p.done) / now.Sub(p.start).Seconds()
	*p = period{start: now, peak: l.inflight}
}

// Stats is a snapshot of a Limiter.
type Stats struct {
	QPS           float64 // current rate, requests/s
	MaxQPS        float64 // its ceiling
	InFlightLimit int     // current in-flight limit
	MaxInFlight   int     // its ceiling
	InFlight      int     // requests in flight now (long-running ones not counted)
	Waiting       int     // requests waiting for an in-flight slot
	// LatencyRatio is the last control period's fastest write latency ÷
	// its method's baseline, the largest over the methods (0 before the
	// first write).
	LatencyRatio float64
	// Baselines is the latency baseline per HTTP method of writes.
	Baselines map[string]time.Duration
	// Decreases counts the decreases by reason.
	Decreases map[Reason]int64
	// Paused is the time left of a Retry-After pause (0: none);
	// PausedTotal the sum of all pauses.
	Paused, PausedTotal time.Duration
	// FlowSchemaUID and PriorityLevelUID are the API Priority and
	// Fairness classification of the last response that carried one
	// (X-Kubernetes-PF-FlowSchema-UID, X-Kubernetes-PF-PriorityLevel-UID);
	// empty before.
	FlowSchemaUID, PriorityLevelUID string
	// Responses counts the responses by classification.
	Responses map[[2]string]int64 // {flow schema UID, priority level UID} → responses
	// Requests counts the tokens handed out (requests let through).
	Requests int64
}

// Stats returns a snapshot of l.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	l.tick(now)
	s := Stats{QPS: l.qps, MaxQPS: l.cfg.MaxQPS, InFlightLimit: l.slots(), MaxInFlight: l.cfg.MaxInFlight,
		InFlight: l.inflight, Waiting: len(l.waiters), LatencyRatio: l.lastRatio,
		Baselines: map[string]time.Duration{}, Decreases: map[Reason]int64{}, PausedTotal: l.pausedTotal,
		FlowSchemaUID: l.last.FlowSchemaUID, PriorityLevelUID: l.last.PriorityLevelUID,
		Responses: map[[2]string]int64{}, Requests: l.sent}
	if now.Before(l.paused) {
		s.Paused = l.paused.Sub(now)
	}
	for m, w := range l.baselines {
		if d, ok := w.current(); ok {
			s.Baselines[m] = d
		}
	}
	for r, n := range l.decreases {
		s.Decreases[r] = n
	}
	for k, n := range l.responses {
		s.Responses[[2]string{k.FlowSchemaUID, k.PriorityLevelUID}] = n
	}
	return s
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
