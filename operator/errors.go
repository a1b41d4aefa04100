package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/jobs"
)

// ErrorsConfig says which error events TailErrors prints and where.
type ErrorsConfig struct {
	// Bus is the connection to the pipeline's JetStream (its prefix names
	// the MAT_ERRORS stream and the mat.errors.<kind> subjects).
	Bus *events.Bus
	// Kinds limits the output to these kinds; empty prints every kind. An
	// unknown kind is an error.
	Kinds []string
	// Since > 0 also prints the events stored in the last Since; 0 prints
	// only new ones.
	Since time.Duration
	// Follow keeps printing new events until ctx ends; false returns after
	// the backlog (and needs Since > 0).
	Follow bool
	// JSON prints each event as its JSON envelope instead of a line.
	JSON bool
	// Out gets the events; Notes gets "waiting for stream" and "no error
	// events" lines.
	Out, Notes io.Writer
	// Reading, when set, is called once the stream is being read (for a
	// readiness check).
	Reading func()
}

// ErrorFilters returns the subjects of kinds (every kind when empty), or an
// error naming a kind that is not one of events.ErrorKinds.
func ErrorFilters(subj events.Subjects, kinds []string) ([]string, error) {
	if len(kinds) == 0 {
		return []string{subj.Errors()}, nil
	}
	var filters []string
	for _, k := range kinds {
		ok := false
		for _, known := range events.ErrorKinds {
			ok = ok || string(known) == k
		}
		if !ok {
			return nil, fmt.Errorf("--kind %q is not an error kind", k)
		}
		filters = append(filters, subj.Error(events.ErrorKind(k)))
	}
	return filters, nil
}

// TailErrors prints the error events cfg selects, through an ordered
// consumer (no durable state: it is deleted on return, or by the server
// consumerInactive after a reader that died). It never creates the
// stream: while MAT_ERRORS does not exist it waits (Follow) or returns an
// error (not Follow). It returns nil when ctx ends or the backlog is printed, and an
// error wrapping the JetStream error when the stream cannot be read.
func TailErrors(ctx context.Context, cfg ErrorsConfig) error {
	filters, err := ErrorFilters(cfg.Bus.Subjects(), cfg.Kinds)
	if err != nil {
		return err
	}
	if !cfg.Follow && cfg.Since <= 0 {
		return errors.New("--follow=false needs --since")
	}
	stream := cfg.Bus.StreamName(events.StreamErrors)
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverNewPolicy, InactiveThreshold: consumerInactive}
	if cfg.Since > 0 {
		start := time.Now().Add(-cfg.Since)
		occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	var cons jetstream.Consumer
	for {
		cons, err = cfg.Bus.OrderedConsumer(ctx, events.StreamErrors, occ)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("read error events: %w", err)
		}
		if !cfg.Follow {
			return fmt.Errorf("stream %s does not exist: no matbus component has started on this NATS server with --subject-prefix %q", stream, cfg.Bus.Subjects().Prefix)
		}
		fmt.Fprintf(cfg.Notes, "waiting for stream %s (no matbus component has started yet)\n", stream)
		if !jobs.Sleep(ctx, 2*time.Second) {
			return nil
		}
	}
	defer cfg.Bus.DropConsumer(ctx, events.StreamErrors, cons)
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("read error events: %w", err)
	}
	defer it.Stop()
	if cfg.Reading != nil {
		cfg.Reading()
	}
	if cfg.Follow {
		// One line, so that a quiet follower is seen to be connected.
		from := "new ones"
		if cfg.Since > 0 {
			from = "those of the last " + cfg.Since.String() + ", then new ones"
		}
		fmt.Fprintf(cfg.Notes, "following error events on %s of stream %s: %s (Ctrl-C stops)\n", strings.Join(filters, ", "), stream, from)
	}
	printed := 0
	for {
		nctx, cancel := ctx, context.CancelFunc(func() {})
		if !cfg.Follow {
			nctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		}
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if !cfg.Follow && printed == 0 && ctx.Err() == nil {
				fmt.Fprintf(cfg.Notes, "no error events in the last %s\n", cfg.Since)
			}
			if ctx.Err() != nil || !cfg.Follow {
				return nil
			}
			return fmt.Errorf("read error events: %w", err)
		}
		printed++
		WriteErrorEvent(cfg.Out, m.Subject(), m.Data(), cfg.JSON)
		if !cfg.Follow {
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				return nil
			}
		}
	}
}

// WriteErrorEvent writes one error event body received on subject: its JSON
// envelope as it is (asJSON), or one line "<RFC 3339 time> <kind>
// key=value… [permanent] [attempts=N] [suppressed=N] [resolved]: <message>".
// A body that does not decode as an error event is written as an
// "unreadable error event" line with the decode error and the quoted body.
func WriteErrorEvent(w io.Writer, subject string, data []byte, asJSON bool) {
	if asJSON {
		fmt.Fprintln(w, strings.TrimSpace(string(data)))
		return
	}
	env, err := events.Decode(data)
	if err == nil {
		var ev events.Error
		if ev, err = events.Into[events.Error](env, events.TypeError); err == nil {
			var b strings.Builder
			fmt.Fprintf(&b, "%s %-9s", env.Time.Format(time.RFC3339), ev.Kind)
			for _, kv := range [][2]string{{"instance", ev.Instance}, {"service", ev.Service}, {"url", ev.URL}, {"mat_id", ev.MatID}, {"subject", ev.Subject}, {"from", ev.Worker}} {
				if kv[1] != "" {
					fmt.Fprintf(&b, " %s=%s", kv[0], kv[1])
				}
			}
			if ev.Permanent {
				b.WriteString(" permanent")
			}
			if ev.Attempts > 0 {
				fmt.Fprintf(&b, " attempts=%d", ev.Attempts)
			}
			if ev.Suppressed > 0 {
				fmt.Fprintf(&b, " suppressed=%d", ev.Suppressed)
			}
			if ev.Resolved {
				b.WriteString(" resolved")
			}
			fmt.Fprintf(&b, ": %s", ev.Message)
			fmt.Fprintln(w, b.String())
			return
		}
	}
	raw, _ := json.Marshal(string(data))
	fmt.Fprintf(w, "unreadable error event on %s (%v): %s\n", subject, err, raw)
}
