package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/kubewatch"
)

// Check is one condition of readiness: Check returns nil when it holds,
// else the reason (one line) it does not.
type Check struct {
	Name  string
	Check func() error
}

// Readiness is the ordered list of a process's readiness conditions.
type Readiness []Check

// Err returns nil when every check holds, else "<name>: <reason>" of the
// first that does not.
func (r Readiness) Err() error {
	for _, c := range r {
		if err := c.Check(); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	return nil
}

// NATS holds while nc is connected.
func NATS(nc *nats.Conn) Check {
	return Check{Name: "NATS", Check: func() error {
		if nc.IsConnected() {
			return nil
		}
		msg := "not connected (" + nc.Status().String() + ")"
		if err := nc.LastError(); err != nil {
			msg += ": " + err.Error()
		}
		return errors.New(msg)
	}}
}

// APIProbe asks the Kubernetes API server for /version every interval (each
// request bounded by timeout) and keeps the last answer. /version is open to
// every authenticated client (the system:public-info-viewer role), so the
// probe needs no RBAC of its own.
type APIProbe struct {
	mu   sync.Mutex
	last error
	done bool // a first answer arrived
}

// StartAPIProbe probes kube until ctx ends, but sends no request while
// answering (may be nil: always probe) reports that the API server answers anyway: a
// worker's Service informer that has synced and whose list and watch calls
// succeed has its watch open, and a broken connection ends that watch (an
// HTTP/2 ping finds a silent one) and fails the next call. In steady state
// a worker then sends no Kubernetes request at all, where the probe alone
// sent 12 a minute.
func StartAPIProbe(ctx context.Context, kube kubernetes.Interface, interval, timeout time.Duration, answering func() bool, log *slog.Logger) *APIProbe {
	p := &APIProbe{}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			var err error
			if answering == nil || !answering() {
				rctx, cancel := context.WithTimeout(ctx, timeout)
				err = kube.Discovery().RESTClient().Get().AbsPath("/version").Do(rctx).Error()
				cancel()
			}
			if ctx.Err() != nil {
				return
			}
			p.set(err, log)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return p
}

func (p *APIProbe) set(err error, log *slog.Logger) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err != nil && (p.last == nil || !p.done):
		log.Warn("Kubernetes API unreachable; not ready until it answers", "error", err)
	case err == nil && p.last != nil:
		log.Info("Kubernetes API reachable again")
	}
	p.last, p.done = err, true
}

// Check is the readiness condition of the probe.
func (p *APIProbe) Check() Check {
	return Check{Name: "Kubernetes API", Check: func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.done {
			return errors.New("not probed yet")
		}
		if p.last != nil {
			return fmt.Errorf("unreachable: %w", p.last)
		}
		return nil
	}}
}

// Informer holds while no list or watch call of t's informer fails;
// the reason is t's, e.g. "watch services: services is forbidden: …".
func Informer(t *kubewatch.Tracker) Check {
	return Check{Name: "informer", Check: t.Err}
}

// Freshness is the readiness condition "something succeeded within
// staleAfter": last returns when it last did (zero: never), since when it
// is expected (zero: not expected now, e.g. a follower).
func Freshness(what string, staleAfter time.Duration, last, since func() time.Time) Check {
	return Check{Name: "discovery", Check: func() error {
		from := since()
		if from.IsZero() {
			return nil
		}
		ref := last()
		if ref.Before(from) {
			ref = from
		}
		if age := time.Since(ref); age > staleAfter {
			if l := last(); !l.IsZero() {
				return fmt.Errorf("no %s succeeded for %v (--health-stale-after %v; last at %s)", what, age.Round(time.Second), staleAfter, l.UTC().Format(time.RFC3339))
			}
			return fmt.Errorf("no %s succeeded for %v (--health-stale-after %v)", what, age.Round(time.Second), staleAfter)
		}
		return nil
	}}
}

// WarnWhileUnready logs a WARN line with the reason every `every` (the
// first after `first`) while r is not ready, so a wait for NATS, the
// Kubernetes API or an informer is never silent, and an INFO line when it
// becomes ready after such a warning. It returns when ctx ends.
func WarnWhileUnready(ctx context.Context, r Readiness, first, every time.Duration, log *slog.Logger) {
	t := time.NewTimer(first)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		switch err := r.Err(); {
		case err != nil:
			log.Warn("not ready, still waiting", "reason", err.Error())
			warned = true
		case warned:
			log.Info("ready")
			warned = false
		}
		t.Reset(every)
	}
}
