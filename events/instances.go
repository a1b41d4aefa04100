// Reads of the instances stream, the lister of this system: LastInstance
// (one key, concurrent calls coalesced), Instances and InstanceNamespaces
// (every key), and PurgeInstance.

package events

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// InstanceRecord is the last event stored for one instance subject.
type InstanceRecord struct {
	Type     Type // TypeInstanceAppeared or TypeInstanceGone
	Instance Instance
	Seq      uint64
	Time     time.Time
	// Epoch is the term of the leader that published it (nil: none).
	Epoch *Epoch
}

// Present reports whether the instance currently exists.
func (r InstanceRecord) Present() bool { return r.Type == TypeInstanceAppeared }

// LastInstance reads the current record of instance key straight from the
// instances stream (the lister of this system). found is false when the
// instance was never announced. A stored message that does not decode is
// returned as an error wrapping ErrMalformed (or ErrUnknownSchema/ErrUnknownType).
//
// Concurrent calls for one key share reads, and every call still gets a
// record read after it was made: a call made while a read of its key is in
// flight joins the next read, which starts once that one has answered and
// serves every call that joined it. So a fan-out's delete jobs of one
// instance, each of which must see the newest record, cost JetStream about
// two STREAM.MSG.GET requests at a time instead of one each. The shared
// read does not end with one caller's ctx (it is bounded by JetStream's
// request timeout); a caller whose ctx ends stops waiting at once, with
// ctx's error.
func (b *Bus) LastInstance(ctx context.Context, key string) (rec InstanceRecord, found bool, err error) {
	b.readMu.Lock()
	if b.reads == nil {
		b.reads = make(map[string]*instanceReads)
	}
	st := b.reads[key]
	if st == nil {
		st = &instanceReads{}
		b.reads[key] = st
	}
	r, prev, lead := st.pending, (*instanceRead)(nil), false
	if r == nil {
		r, lead = &instanceRead{done: make(chan struct{})}, true
		if st.running == nil {
			st.running = r
		} else {
			st.pending, prev = r, st.running
		}
	}
	b.readMu.Unlock()
	if lead {
		go b.runRead(context.WithoutCancel(ctx), key, st, r, prev)
	}
	select {
	case <-r.done:
		return r.rec, r.found, r.err
	case <-ctx.Done():
		return rec, false, ctx.Err()
	}
}

// runRead performs the shared read r of key once prev (the read in flight
// when r was made, or nil) has answered, and closes r.done. ctx carries no
// cancellation of any one caller: JetStream's request timeout (5 s when ctx
// has no deadline) bounds the read, and so this goroutine.
func (b *Bus) runRead(ctx context.Context, key string, st *instanceReads, r, prev *instanceRead) {
	if prev != nil {
		<-prev.done
		b.readMu.Lock()
		st.running, st.pending = r, nil
		b.readMu.Unlock()
	}
	r.rec, r.found, r.err = b.readInstance(ctx, key)
	b.readMu.Lock()
	if st.running == r {
		st.running = nil
		if st.pending == nil {
			delete(b.reads, key)
		}
	}
	b.readMu.Unlock()
	close(r.done)
}

// instanceReads are the LastInstance reads of one key: the one in flight
// and the one that starts after it, which calls made meanwhile join.
type instanceReads struct {
	running, pending *instanceRead
}

// instanceRead is one shared read; its result is set before done closes.
type instanceRead struct {
	done  chan struct{}
	rec   InstanceRecord
	found bool
	err   error
}

// readInstance is one STREAM.MSG.GET of key's last record (LastInstance).
func (b *Bus) readInstance(ctx context.Context, key string) (rec InstanceRecord, found bool, err error) {
	s, err := b.instancesStream(ctx)
	if err != nil {
		return rec, false, err
	}
	m, err := s.GetLastMsgForSubject(ctx, b.subjects.Instance(key))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return rec, false, nil
	}
	if err != nil {
		b.forgetInstancesStream(s)
		return rec, false, fmt.Errorf("events: read instance %s: %w", key, err)
	}
	rec, err = decodeInstanceRecord(m.Data)
	if err == nil && rec.Instance.Key != key {
		err = fmt.Errorf("%w: record on %s names instance %q", ErrMalformed, m.Subject, rec.Instance.Key)
	}
	rec.Seq, rec.Time = m.Sequence, m.Time
	return rec, err == nil, err
}

// instancesStream returns the instances stream's handle, looked up (one
// STREAM.INFO request) on first use and kept: a message read by subject
// needs only the stream's name, so a delete job costs one JetStream request,
// not two. Errors: the stream cannot be looked up (not created yet, NATS
// unreachable).
func (b *Bus) instancesStream(ctx context.Context) (jetstream.Stream, error) {
	b.mu.Lock()
	s := b.instances
	b.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := b.js.Stream(ctx, b.StreamName(StreamInstances))
	if err != nil {
		return nil, fmt.Errorf("events: instances stream: %w", err)
	}
	b.mu.Lock()
	b.instances = s
	b.mu.Unlock()
	return s, nil
}

// forgetInstancesStream drops the kept handle s after a failed read, so the
// next read looks the stream up again (it may have been re-created with
// another configuration).
func (b *Bus) forgetInstancesStream(s jetstream.Stream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.instances == s {
		b.instances = nil
	}
}

func decodeInstanceRecord(body []byte) (InstanceRecord, error) {
	env, err := Decode(body)
	if err != nil {
		return InstanceRecord{}, err
	}
	inst, err := Into[Instance](env, TypeInstanceAppeared, TypeInstanceGone)
	if err != nil {
		return InstanceRecord{}, err
	}
	return InstanceRecord{Type: env.Type, Instance: inst, Epoch: env.Epoch}, nil
}

// InstanceNamespaces returns, sorted, the namespaces that have at least
// one instance record (present or gone) in the instances stream under this
// bus's subject prefix: those where a discovery has published. Errors: the
// stream or its info cannot be read (jetstream.ErrStreamNotFound when no
// discovery ever started under this prefix).
func (b *Bus) InstanceNamespaces(ctx context.Context) ([]string, error) {
	s, err := b.js.Stream(ctx, b.StreamName(StreamInstances))
	if err != nil {
		return nil, fmt.Errorf("events: instances stream: %w", err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(b.subjects.Instances()))
	if err != nil {
		return nil, fmt.Errorf("events: instances stream info: %w", err)
	}
	seen := map[string]bool{}
	for subj := range info.State.Subjects {
		if ns, _, ok := strings.Cut(strings.TrimPrefix(subj, b.subjects.p()+".instances."), "."); ok && ns != "" {
			seen[ns] = true
		}
	}
	out := make([]string, 0, len(seen))
	for ns := range seen {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out, nil
}

// Instances returns the current record of every instance subject of the
// bus's namespace (every namespace when Config.Namespace is empty), keyed by
// instance key. Records that do not decode are skipped and their keys
// returned in bad, so the caller can report them.
func (b *Bus) Instances(ctx context.Context) (recs map[string]InstanceRecord, bad []string, err error) {
	s, err := b.js.Stream(ctx, b.StreamName(StreamInstances))
	if err != nil {
		return nil, nil, fmt.Errorf("events: instances stream: %w", err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(b.subjects.InstancesIn(b.cfg.Namespace)))
	if err != nil {
		return nil, nil, fmt.Errorf("events: instances stream info: %w", err)
	}
	recs = make(map[string]InstanceRecord, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("events: read %s: %w", subj, err)
		}
		key := strings.TrimPrefix(subj, b.subjects.p()+".instances.")
		rec, err := decodeInstanceRecord(m.Data)
		if err == nil && rec.Instance.Key != key {
			err = ErrMalformed
		}
		if err != nil {
			bad = append(bad, key)
			continue
		}
		rec.Seq, rec.Time = m.Sequence, m.Time
		recs[key] = rec
	}
	slices.Sort(bad)
	return recs, bad, nil
}

// PurgeInstance removes every stored record of instance key from the
// instances stream (the discovery leader drops a record that does not
// decode). Errors: the stream cannot be looked up or purged, wrapped.
func (b *Bus) PurgeInstance(ctx context.Context, key string) error {
	s, err := b.js.Stream(ctx, b.StreamName(StreamInstances))
	if err != nil {
		return fmt.Errorf("events: instances stream: %w", err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(b.subjects.Instance(key))); err != nil {
		return fmt.Errorf("events: purge %s: %w", b.subjects.Instance(key), err)
	}
	return nil
}
