package jobs

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// subjectGate lets at most one job per subject (for sync jobs: per instance)
// run at a time in this worker. A job whose subject is busy waits outside
// the job slots and keeps its delivery alive with InProgress. When a newer
// job of the same subject arrives, the waiting one is acknowledged as
// superseded: sync and clean-up jobs are level-triggered, so the newer job,
// still unacknowledged, does the same work later (and is redelivered if this
// worker dies). It is safe for concurrent use.
type subjectGate struct {
	progress time.Duration
	// superseded, when set, is told of each waiting job acknowledged
	// because a newer one of its subject arrived.
	superseded func(jetstream.Msg)

	mu      sync.Mutex
	busy    map[string]bool
	waiting map[string]*waitingJob
}

type waitingJob struct {
	msg  jetstream.Msg
	halt func() // ends its progress reports
}

func newSubjectGate(progress time.Duration) *subjectGate {
	return &subjectGate{progress: progress, busy: map[string]bool{}, waiting: map[string]*waitingJob{}}
}

// admit reports whether msg may run now. If its subject is busy, msg is held
// (replacing and acknowledging an older held job of that subject) until
// done hands it back, and admit returns false.
func (g *subjectGate) admit(msg jetstream.Msg) bool {
	subj := msg.Subject()
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.busy[subj] {
		g.busy[subj] = true
		return true
	}
	if old := g.waiting[subj]; old != nil {
		old.halt()
		_ = old.msg.Ack() // superseded by msg
		if g.superseded != nil {
			g.superseded(old.msg)
		}
	}
	g.waiting[subj] = &waitingJob{msg: msg, halt: keepAlive(msg, g.progress)}
	return false
}

// done ends the running job of subj. It returns the job waiting for subj,
// which the caller must run (the subject stays busy), or nil (the subject
// is free again).
func (g *subjectGate) done(subj string) jetstream.Msg {
	g.mu.Lock()
	defer g.mu.Unlock()
	if wj := g.waiting[subj]; wj != nil {
		delete(g.waiting, subj)
		wj.halt()
		return wj.msg
	}
	delete(g.busy, subj)
	return nil
}

// release naks every waiting job, leaving it for redelivery (shutdown).
func (g *subjectGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for subj, wj := range g.waiting {
		wj.halt()
		_ = wj.msg.Nak()
		delete(g.waiting, subj)
	}
}
