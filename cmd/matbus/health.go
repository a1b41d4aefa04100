package main

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

// readyCheck is one condition of readiness: check returns nil when it
// holds, else the reason (one line) it does not.
type readyCheck struct {
	name  string
	check func() error
}

// readiness is the ordered list of a process's readiness conditions.
type readiness []readyCheck

// err returns nil when every check holds, else "<name>: <reason>" of the
// first that does not.
func (r readiness) err() error {
	for _, c := range r {
		if err := c.check(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// natsCheck holds while nc is connected.
func natsCheck(nc *nats.Conn) readyCheck {
	return readyCheck{name: "NATS", check: func() error {
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

// apiProbe asks the Kubernetes API server for /version every interval (each
// request bounded by timeout) and keeps the last answer. /version is open to
// every authenticated client (the system:public-info-viewer role), so the
// probe needs no RBAC of its own.
type apiProbe struct {
	mu   sync.Mutex
	last error
	done bool // a first answer arrived
}

// startAPIProbe probes kube until ctx ends.
func startAPIProbe(ctx context.Context, kube kubernetes.Interface, interval, timeout time.Duration, log *slog.Logger) *apiProbe {
	return startAPIProbeUnless(ctx, kube, interval, timeout, nil, log)
}

// startAPIProbeUnless is startAPIProbe that sends no request while
// answering (may be nil) reports that the API server answers anyway: a
// worker's Service informer that has synced and whose list and watch calls
// succeed has its watch open, and a broken connection ends that watch (an
// HTTP/2 ping finds a silent one) and fails the next call. In steady state
// a worker then sends no Kubernetes request at all, where the probe alone
// sent 12 a minute.
func startAPIProbeUnless(ctx context.Context, kube kubernetes.Interface, interval, timeout time.Duration, answering func() bool, log *slog.Logger) *apiProbe {
	p := &apiProbe{}
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

func (p *apiProbe) set(err error, log *slog.Logger) {
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

// check is the readiness condition of the probe.
func (p *apiProbe) check() readyCheck {
	return readyCheck{name: "Kubernetes API", check: func() error {
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

// informerCheck holds while no list or watch call of t's informer fails;
// the reason is t's, e.g. "watch services: services is forbidden: …".
func informerCheck(t *kubewatch.Tracker) readyCheck {
	return readyCheck{name: "informer", check: t.Err}
}

// freshness is the readiness condition "something succeeded within
// staleAfter": last returns when it last did (zero: never), since when it
// is expected (zero: not expected now, e.g. a follower).
func freshness(what string, staleAfter time.Duration, last, since func() time.Time) readyCheck {
	return readyCheck{name: "discovery", check: func() error {
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

// warnWhileUnready logs a WARN line with the reason every `every` (the
// first after `first`) while r is not ready, so a wait for NATS, the
// Kubernetes API or an informer is never silent, and an INFO line when it
// becomes ready after such a warning. It returns when ctx ends.
func warnWhileUnready(ctx context.Context, r readiness, first, every time.Duration, log *slog.Logger) {
	t := time.NewTimer(first)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		switch err := r.err(); {
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
