package devenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// summary is the run's Summary, stopped for the reason given.
func (r *devRun) summary(stopped string) Summary {
	return Summary{Converged: stopped == "converged", Services: r.count(), Expected: r.expected, Errors: r.errs.count.Load(),
		ElapsedSeconds: float64(time.Since(r.start).Milliseconds()) / 1000, NATSURL: r.natsURL, Kubeconfig: r.kubeconfig,
		Namespace: r.cfg.Namespace, Stopped: stopped}
}

// await prints one line when every expected Service exists, then
// (without Once) the commands to look at the running pipeline, and runs
// until ctx ends; with Once it returns as soon as the run converged or
// gave up, after the JSON summary.
func (r *devRun) await(ctx context.Context) error {
	inPlace, watched := make(chan struct{}), make(chan struct{})
	next := NextSteps(Steps{NATSURL: r.natsURL, Namespace: r.cfg.Namespace, Kubeconfig: r.kubeconfig, SourcesURL: r.sourcesURL,
		Entries: r.entries, Flags: r.cfg.PassedFlags})
	go func() {
		defer close(watched)
		r.announce(next, inPlace)
	}()
	defer func() { <-watched }()
	if !r.cfg.Once {
		<-ctx.Done()
		r.stopAll()
		return nil
	}
	return r.untilDone(ctx, inPlace)
}

// announce closes inPlace and says so once every expected Service exists.
// A run whose Services are not all in place after NextStepsAfter (an IP
// taken on a shared cluster, a refused create) prints how far it got and
// the next steps then, to look at it with. It returns when runCtx ends.
func (r *devRun) announce(next string, inPlace chan struct{}) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	var late <-chan time.Time
	if !r.cfg.Once {
		lt := time.NewTimer(r.cfg.NextStepsAfter)
		defer lt.Stop()
		late = lt.C
	}
	for {
		select {
		case <-r.runCtx.Done():
			return
		case <-late:
			fmt.Fprintf(r.out, "%d of %d Services in place after %.0fs (the ERROR lines say why)\n%s", r.count(), r.expected, time.Since(r.start).Seconds(), next)
			next = ""
		case <-t.C:
			if r.count() >= r.expected {
				msg := fmt.Sprintf("All %d Services in place after %.1fs\n", r.expected, time.Since(r.start).Seconds())
				if !r.cfg.Once {
					msg += next
				}
				_, _ = io.WriteString(r.out, msg)
				close(inPlace)
				return
			}
		}
	}
}

// untilDone waits, with Once, for convergence, the timeout, ctx, or the
// point where every remaining problem is permanent: Services stopped
// changing, permanent errors came and no transient one, for two sync
// intervals. It writes the summary.
func (r *devRun) untilDone(ctx context.Context, inPlace <-chan struct{}) error {
	deadline := time.NewTimer(r.cfg.Timeout)
	defer deadline.Stop()
	settle := 2*r.cfg.Publisher.SyncInterval + 5*time.Second
	check := time.NewTicker(500 * time.Millisecond)
	defer check.Stop()
	lastCount, lastChange := r.count(), time.Now()
	for {
		select {
		case <-ctx.Done():
			r.stopAll()
			return writeSummary(r.out, r.summary("interrupted"))
		case <-deadline.C:
			r.stopAll()
			return writeSummary(r.out, r.summary("timeout"))
		case <-inPlace:
			s := r.summary("converged")
			r.stopAll()
			return writeSummary(r.out, s)
		case now := <-check.C:
			if c := r.count(); c != lastCount {
				lastCount, lastChange = c, now
			}
			p, tr := r.errs.lastPermanent.Load(), r.errs.lastTransient.Load()
			if p != 0 && now.Sub(lastChange) > settle && now.Sub(time.Unix(0, tr)) > settle {
				fmt.Fprintf(r.out, "Stopping: %d of %d Services in place and every remaining problem is permanent (the ERROR lines above)\n", lastCount, r.expected)
				s := r.summary("permanent")
				r.stopAll()
				return writeSummary(r.out, s)
			}
		}
	}
}

// writeSummary prints s as one JSON line; ErrStopped unless it converged.
func writeSummary(out io.Writer, s Summary) error {
	b, _ := json.Marshal(s)
	fmt.Fprintln(out, string(b))
	if !s.Converged {
		return ErrStopped
	}
	return nil
}
