package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/matbus/matbus/bench/internal/load"
)

// result is everything one run measured; it is what --json writes.
type result struct {
	Config   *config                      `json:"config"`
	Machine  string                       `json:"machine"`
	Version  string                       `json:"matbus_version"`
	Defaults map[string]map[string]string `json:"defaults"` // subcommand → flag → default, from --help
	Floors   []*floorResult               `json:"floors"`   // one per repetition
	Idle     *apiWindow                   `json:"idle_api_server,omitempty"`
	Rounds   []*roundResult               `json:"rounds"`
	Rows     []tableRow                   `json:"rows"`
	Markdown string                       `json:"markdown"`
	Pinned   *pinPlan                     `json:"pinned,omitempty"`   // --pin-control-plane (the default)
	Unpinned string                       `json:"unpinned,omitempty"` // why the run is not pinned
	// Interrupted says why the run stopped early (Ctrl-C, SIGTERM); the
	// table then holds what was measured until then.
	Interrupted string `json:"interrupted,omitempty"`
}

// floorResult is the raw client-go floor: creates and deletes of the same
// Services, InFlight calls at once, no client-side rate limit.
type floorResult struct {
	Repeat    int             `json:"repeat"` // repetition, from 1
	Services  int             `json:"services"`
	Create    load.Timed      `json:"create"`
	CreateCPU *load.CPUUse    `json:"create_cpu,omitempty"`
	Delete    load.Timed      `json:"delete"`
	DeleteCPU *load.CPUUse    `json:"delete_cpu,omitempty"`
	DeleteAPI requestCounts   `json:"delete_api_requests,omitempty"` // the API server's requests during the deletes
	Neighbour *neighbourFloor `json:"neighbour,omitempty"`
}

// apiWindow is the API server's request count over a window.
type apiWindow struct {
	Seconds   float64       `json:"seconds"`
	PerMinute float64       `json:"per_minute"` // (Raw total − Harness) per minute
	Raw       requestCounts `json:"raw"`        // apiserver_request_total delta by "VERB resource"
	Harness   int64         `json:"harness"`    // the harness's own requests in the window
	// Audit is the window's requests by client, from the audit log.
	Audit       auditCounts `json:"audit,omitempty"`
	Interrupted bool        `json:"interrupted,omitempty"`
}

// phase is one timed change: from the change to the watch event that
// completed it.
type phase struct {
	Seconds float64 `json:"seconds"`
	// First is when the first of the Services was written (its watch
	// event), seconds from the phase's start: the pipeline's reaction.
	First    float64 `json:"first_seconds,omitempty"`
	Count    int     `json:"services"`
	TimedOut bool    `json:"timed_out,omitempty"`
	Missing  int     `json:"missing,omitempty"`
	Why      string  `json:"why,omitempty"` // why the wait ended early: "timeout", a process exit, …
}

// reactions are the single-BMC change latencies: over all changes, over
// host changes (MAT bumps its status generation) and over the others
// (DPU, switch, power shelf: no generation bump).
type reactions struct {
	Changes int         `json:"changes"`
	Seen    int         `json:"seen"`
	All     latencies   `json:"all"`
	Host    latencies   `json:"host"`
	Other   latencies   `json:"other"`
	List    []*reaction `json:"list"`
}

// latencies summarize N change latencies (seconds).
type latencies struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_seconds"`
	P99 float64 `json:"p99_seconds"`
}

// reaction is one single-BMC change; Seconds is nil when its watch event
// did not arrive in time.
type reaction struct {
	Instance int      `json:"instance"`
	Op       string   `json:"op"`   // add or remove
	Kind     string   `json:"kind"` // host, dpu, switch, power-shelf
	Seconds  *float64 `json:"seconds"`
}

// roundResult is one scenario run with Workers worker processes.
type roundResult struct {
	Workers               int              `json:"workers"`
	Repeat                int              `json:"repeat"` // repetition, from 1
	Column                int              `json:"column"` // index of Workers in --workers
	Services              int              `json:"services"`
	Converge              *phase           `json:"converge,omitempty"`
	Grow                  *phase           `json:"grow,omitempty"`
	Shrink                *phase           `json:"shrink,omitempty"`
	Delete                *phase           `json:"delete,omitempty"`
	DeleteCPU             *load.CPUUse     `json:"delete_cpu,omitempty"`
	DeleteAPI             requestCounts    `json:"delete_api_requests,omitempty"` // the API server's requests during the fan-out
	Reactions             *reactions       `json:"reactions,omitempty"`
	API                   *apiWindow       `json:"steady_api,omitempty"`
	MATGetsPerInstanceMin float64          `json:"mat_gets_per_instance_per_minute"`
	NewConnsPerInstance   float64          `json:"new_connections_per_instance"`
	MATCost               *matCost         `json:"mat_cost,omitempty"`
	WorkerRSS             int64            `json:"worker_rss_bytes"`
	WorkerHWM             int64            `json:"worker_hwm_bytes"`
	Notes                 []string         `json:"notes,omitempty"`
	Neighbour             *neighbourWindow `json:"neighbour,omitempty"` // during the re-converge after the fan-out
	Scale                 *roundScale      `json:"scale,omitempty"`
}

// rowDef defines a table row: its measure, unit, how a repetition's floor
// is computed (nil: the row has none) and how a round's cell is computed.
type rowDef struct {
	measure, unit string
	floor         func(*floorResult) *float64
	cell          func(*roundResult) (*float64, string)
}

// tableRow is one row of the table: a floor (when one applies) and a cell
// per worker count. Floor is the median of Floors, one per repetition
// (nil where that repetition's floor failed).
type tableRow struct {
	Measure string      `json:"measure"`
	Unit    string      `json:"unit"`
	Floor   *float64    `json:"floor,omitempty"`
	Floors  []*float64  `json:"floors,omitempty"`
	Cells   []tableCell `json:"cells"`
}

// tableCell is a row's value for one worker count: the median of Values
// (one per repetition that measured it; nil when none did: the wait timed
// out or the phase did not run), and Ratio, the median of Ratios, each a
// repetition's value ÷ that repetition's floor.
type tableCell struct {
	Workers int       `json:"workers"`
	Value   *float64  `json:"value"`
	Ratio   *float64  `json:"ratio,omitempty"`
	Values  []float64 `json:"values,omitempty"`
	Ratios  []float64 `json:"ratios,omitempty"`
	Note    string    `json:"note,omitempty"`
}

// median is the middle value of vs (the mean of the two middle ones for an
// even count), nil for none. vs is not modified.
func median(vs []float64) *float64 {
	if len(vs) == 0 {
		return nil
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return ptr(s[m])
	}
	return ptr((s[m-1] + s[m]) / 2)
}

func ptr(v float64) *float64 { return &v }

// cellOf turns a phase into a value or a timeout note.
func cellOf(p *phase, value func(*phase) float64) (*float64, string) {
	switch {
	case p == nil:
		return nil, ""
	case p.TimedOut:
		why := p.Why
		if why != errTimeout.Error() {
			why, _, _ = strings.Cut(why, ";") // a process exit: its name and status
		}
		return nil, fmt.Sprintf("%s (%d of %d missing)", why, p.Missing, p.Count)
	}
	return ptr(value(p)), ""
}

func secs(p *phase) float64 { return p.Seconds }

// rows builds the table rows from the floors and the rounds.
func (r *result) rows() []tableRow {
	createOf := func(f *floorResult) *float64 {
		if f.Create.TimedOut || f.Create.Failed > 0 {
			return nil
		}
		return ptr(f.Create.Seconds)
	}
	deleted := func(f *floorResult) bool {
		return !f.Delete.TimedOut && f.Delete.Failed == 0 && f.Delete.Seconds > 0
	}
	deleteOf := func(f *floorResult) *float64 {
		if !deleted(f) {
			return nil
		}
		return ptr(f.Delete.Seconds)
	}
	rateOf := func(f *floorResult) *float64 {
		if !deleted(f) {
			return nil
		}
		return ptr(float64(f.Services) / f.Delete.Seconds)
	}
	busyOf := func(f *floorResult) *float64 {
		if !deleted(f) || f.DeleteCPU == nil {
			return nil
		}
		return ptr(f.DeleteCPU.Busy / max(f.DeleteCPU.Wall, 1e-9))
	}
	var idleOf func(*floorResult) *float64
	if r.Idle != nil && !r.Idle.Interrupted {
		idle := r.Idle.PerMinute
		idleOf = func(*floorResult) *float64 { return ptr(idle) }
	}
	n := r.Config.Services
	k := r.Config.Reactions
	steady := num(r.Config.Steady.Seconds()) + " s"
	defs := []rowDef{
		{fmt.Sprintf("1. converge from empty, %d Services", n), "s", createOf,
			func(x *roundResult) (*float64, string) { return cellOf(x.Converge, secs) }},
		{fmt.Sprintf("2. grow: one instance +%d BMCs", growBMCs), "s", nil,
			func(x *roundResult) (*float64, string) { return cellOf(x.Grow, secs) }},
		{fmt.Sprintf("3. shrink: one instance −%d BMCs", growBMCs), "s", nil,
			func(x *roundResult) (*float64, string) { return cellOf(x.Shrink, secs) }},
		{fmt.Sprintf("4. delete fan-out, %d Services", n), "s", deleteOf,
			func(x *roundResult) (*float64, string) { return cellOf(x.Delete, secs) }},
		{"4. delete rate", "Services/s", rateOf,
			func(x *roundResult) (*float64, string) {
				return cellOf(x.Delete, func(p *phase) float64 { return float64(p.Count) / max(p.Seconds, 1e-9) })
			}},
		{"4. fan-out: first Service gone", "s", nil,
			func(x *roundResult) (*float64, string) {
				return cellOf(x.Delete, func(p *phase) float64 { return p.First })
			}},
		cpuRow("kube-apiserver"), cpuRow("etcd"), cpuRow(roleMatbus), cpuRow("nats-server"), cpuRow("harness"),
		{"4. matbus + nats-server CPU ÷ kube-apiserver's, per deleted Service", "×", nil,
			func(x *roundResult) (*float64, string) {
				if x.Delete == nil || x.Delete.TimedOut {
					return nil, ""
				}
				return ownShare(x.DeleteCPU), ""
			}},
		{"4. machine CPU busy during the fan-out", "cores", busyOf,
			func(x *roundResult) (*float64, string) {
				if x.DeleteCPU == nil || x.Delete == nil || x.Delete.TimedOut {
					return nil, ""
				}
				return ptr(x.DeleteCPU.Busy / max(x.DeleteCPU.Wall, 1e-9)), ""
			}},
		{fmt.Sprintf("5. reaction p50, %d single-BMC change%s", k, plural(k)), "s", nil,
			func(x *roundResult) (*float64, string) { return reactionCell(x.Reactions, all, false) }},
		{"5. reaction p99", "s", nil,
			func(x *roundResult) (*float64, string) { return reactionCell(x.Reactions, all, true) }},
		{"5. reaction p50, host changes (MAT generation bumps)", "s", nil,
			func(x *roundResult) (*float64, string) { return reactionCell(x.Reactions, hosts, false) }},
		{"5. reaction p50, DPU/switch/shelf changes (no bump)", "s", nil,
			func(x *roundResult) (*float64, string) { return reactionCell(x.Reactions, others, false) }},
		{"6. API requests per steady minute", "req/min", idleOf,
			func(x *roundResult) (*float64, string) {
				if x.API == nil {
					return nil, ""
				}
				if x.API.Interrupted {
					return nil, "interrupted"
				}
				return ptr(x.API.PerMinute), ""
			}},
		{"7. MAT GETs per instance per minute", "GET/min", nil,
			func(x *roundResult) (*float64, string) {
				if x.API == nil {
					return nil, ""
				}
				if x.API.Interrupted {
					return nil, "interrupted"
				}
				return ptr(x.MATGetsPerInstanceMin), ""
			}},
		{"7. new TCP connections per instance in " + steady, "conns", nil,
			func(x *roundResult) (*float64, string) {
				if x.API == nil {
					return nil, ""
				}
				if x.API.Interrupted {
					return nil, "interrupted"
				}
				return ptr(x.NewConnsPerInstance), ""
			}},
		{"8. worker VmRSS after the run, max", "MiB", nil,
			func(x *roundResult) (*float64, string) { return memCell(x.WorkerRSS) }},
		{"8. worker VmHWM (peak RSS), max", "MiB", nil,
			func(x *roundResult) (*float64, string) { return memCell(x.WorkerHWM) }},
	}
	defs = append(defs, scaleRows(r)...)
	defs = append(defs, matCostRows()...)
	defs = append(defs, neighbourRows(r)...)
	floorOf := map[int]*floorResult{}
	for _, f := range r.Floors {
		floorOf[f.Repeat] = f
	}
	var rows []tableRow
	for _, d := range defs {
		row := tableRow{Measure: d.measure, Unit: d.unit}
		floorAt := func(rep int) *float64 {
			if f := floorOf[rep]; f != nil && d.floor != nil {
				return d.floor(f)
			}
			return nil
		}
		if d.floor != nil {
			var fs []float64
			for _, f := range r.Floors {
				v := floorAt(f.Repeat)
				row.Floors = append(row.Floors, v)
				if v != nil {
					fs = append(fs, *v)
				}
			}
			row.Floor = median(fs)
		}
		for col, workers := range r.Config.Workers {
			c := tableCell{Workers: workers}
			var notes []string
			for _, rr := range r.Rounds {
				if rr.Column != col {
					continue
				}
				v, note := d.cell(rr)
				if note != "" && !slices.Contains(notes, note) {
					notes = append(notes, note)
				}
				if v == nil {
					continue
				}
				c.Values = append(c.Values, *v)
				if f := floorAt(rr.Repeat); f != nil && *f > 0 {
					c.Ratios = append(c.Ratios, *v / *f)
				}
			}
			c.Value, c.Ratio, c.Note = median(c.Values), median(c.Ratios), strings.Join(notes, "; ")
			row.Cells = append(row.Cells, c)
		}
		rows = append(rows, row)
	}
	return rows
}

func all(r *reactions) latencies    { return r.All }
func hosts(r *reactions) latencies  { return r.Host }
func others(r *reactions) latencies { return r.Other }

// reactionCell is the p50 (or p99) of the latencies pick selects, with a
// timeout note when some changes were not seen.
func reactionCell(r *reactions, pick func(*reactions) latencies, p99 bool) (*float64, string) {
	if r == nil {
		return nil, ""
	}
	note := ""
	if r.Seen < r.Changes {
		note = fmt.Sprintf("timeout (%d of %d seen)", r.Seen, r.Changes)
	}
	l := pick(r)
	if l.N == 0 {
		return nil, note
	}
	if p99 {
		return ptr(l.P99), note
	}
	return ptr(l.P50), note
}

func memCell(b int64) (*float64, string) {
	if b == 0 {
		return nil, ""
	}
	return ptr(mib(b)), ""
}

// num formats a measurement with about three significant digits.
func num(v float64) string {
	switch a := max(v, -v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// table renders the run as markdown: a heading, what ran, the rows and
// notes. It also stores the rows in r.Rows.
func (r *result) table() string {
	r.Rows = r.rows()
	c := r.Config
	var b strings.Builder
	sizes := splitSizes(c.Services, c.Simulators)
	pinned := "control plane unpinned"
	if r.Pinned != nil {
		pinned = "control plane pinned"
	}
	fmt.Fprintf(&b, "## matbus end to end: %d Services, %d simulators × %d BMCs, %s\n\n", c.Services, c.Simulators, sizes[0], pinned)
	fmt.Fprintf(&b, "- CPUs: %s\n", cpusLine(r.Pinned, r.Unpinned))
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "- machine: %s (%s); %s\n", r.Machine, host, r.Version)
	fmt.Fprintf(&b, "- matbus defaults: %s\n", r.defaultsLine())
	if len(c.WorkerArgs) > 0 || len(c.DiscoveryArgs) > 0 {
		fmt.Fprintf(&b, "- extra flags: worker %q, discovery %q\n", strings.Join(c.WorkerArgs, " "), strings.Join(c.DiscoveryArgs, " "))
	}
	asWorker := ""
	if c.FloorAsWorker {
		asWorker = " sending a worker's requests (protobuf, deletes with UID and resourceVersion preconditions) under two Service watches"
	}
	fmt.Fprintf(&b, "- floor: raw client-go on the same API server, %d calls in flight%s, no client-side rate limit; "+
		"row 6's floor is the API server with no matbus process running; ratio = value ÷ floor\n", c.InFlight, asWorker)
	if r.Interrupted != "" {
		fmt.Fprintf(&b, "- **interrupted** (%s): the table holds what was measured until then\n", r.Interrupted)
	}
	if c.Repeat > 1 {
		fmt.Fprintf(&b, "- %d repetitions, each a floor and then the rounds: every cell is the median over the repetitions, "+
			"its ratio the median of the repetitions' own ratios (value ÷ that repetition's floor), then the range in brackets\n", c.Repeat)
	}
	b.WriteString("\n| measure | unit | floor |")
	for _, w := range c.Workers {
		fmt.Fprintf(&b, " %d worker%s |", w, plural(w))
	}
	b.WriteString("\n|---|---|---:|")
	for range c.Workers {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, row := range r.Rows {
		floor := "—"
		if row.Floor != nil {
			var fs []float64
			for _, f := range row.Floors {
				if f != nil {
					fs = append(fs, *f)
				}
			}
			floor = num(*row.Floor) + spread(fs, "")
		}
		fmt.Fprintf(&b, "| %s | %s | %s |", row.Measure, row.Unit, floor)
		for _, cell := range row.Cells {
			s := "—"
			switch {
			case cell.Value != nil && cell.Ratio != nil:
				s = fmt.Sprintf("%s (%s×)", num(*cell.Value), num(*cell.Ratio))
				if len(cell.Ratios) > 1 && slices.Min(cell.Ratios) != slices.Max(cell.Ratios) {
					s = fmt.Sprintf("%s (%s×; %s×–%s×)", num(*cell.Value), num(*cell.Ratio), num(slices.Min(cell.Ratios)), num(slices.Max(cell.Ratios)))
				}
			case cell.Value != nil:
				s = num(*cell.Value) + spread(cell.Values, "")
			}
			if cell.Note != "" {
				if cell.Value == nil {
					s = cell.Note
				} else {
					s += " " + cell.Note
				}
			}
			fmt.Fprintf(&b, " %s |", s)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	for _, f := range r.Floors {
		if f.Create.Failed > 0 || f.Delete.Failed > 0 || f.Create.TimedOut || f.Delete.TimedOut {
			fmt.Fprintf(&b, "- floor%s: %d of %d creates and %d of %d deletes failed (timeout: %v/%v)\n", r.repTag(f.Repeat),
				f.Create.Failed, f.Create.Calls, f.Delete.Failed, f.Delete.Calls, f.Create.TimedOut, f.Delete.TimedOut)
		}
	}
	if r.Idle != nil {
		fmt.Fprintf(&b, "- API server alone, %s: %s\n", num(r.Idle.Seconds)+" s", orNone(r.Idle.Raw.String()))
		if r.Idle.Audit != nil {
			fmt.Fprintf(&b, "  - by client (audit log): %s\n", orNone(r.Idle.Audit.String()))
		}
	}
	for _, rr := range r.Rounds {
		if rr.API != nil {
			fmt.Fprintf(&b, "- %d worker%s%s, steady %s s: %s (%d of them the harness's)\n", rr.Workers, plural(rr.Workers),
				r.repTag(rr.Repeat), num(rr.API.Seconds), orNone(rr.API.Raw.String()), rr.API.Harness)
			if rr.API.Audit != nil {
				fmt.Fprintf(&b, "  - by client (audit log): %s\n", orNone(rr.API.Audit.String()))
			}
		}
		for _, n := range scaleNotes(rr) {
			fmt.Fprintf(&b, "  - %s\n", n)
		}
		for _, n := range rr.Notes {
			fmt.Fprintf(&b, "- %d worker%s%s: %s\n", rr.Workers, plural(rr.Workers), r.repTag(rr.Repeat), n)
		}
	}
	return b.String()
}

// defaultsLine names the defaults that shape the table, as read from
// `matbus <sub> --help`, and what the harness overrode.
func (r *result) defaultsLine() string {
	var parts []string
	add := func(sub, flag string) {
		if v, ok := r.Defaults[sub][flag]; ok {
			parts = append(parts, fmt.Sprintf("%s --%s %s", sub, flag, v))
		}
	}
	if r.Config.SyncInterval > 0 {
		parts = append(parts, fmt.Sprintf("discovery --sync-interval %s (set by the harness)", r.Config.SyncInterval))
	} else {
		add("discovery", "sync-interval")
	}
	add("discovery", "poll-interval")
	add("discovery", "poll-max-interval")
	for _, f := range []string{"kube-rate", "kube-qps", "kube-burst", "kube-qps-max", "kube-max-inflight", "jobs", "fetches", "delete-jobs", "concurrency", "mat-timeout", "mat-body-max-age"} {
		add("worker", f)
	}
	return strings.Join(parts, ", ")
}

// spread is " (min–max)" of vs with unit appended to each bound, or ""
// for fewer than two values or when they are all equal.
func spread(vs []float64, unit string) string {
	if len(vs) < 2 || slices.Min(vs) == slices.Max(vs) {
		return ""
	}
	return fmt.Sprintf(" (%s%s–%s%s)", num(slices.Min(vs)), unit, num(slices.Max(vs)), unit)
}

// repTag names repetition rep (", repetition 2") when there are several.
func (r *result) repTag(rep int) string {
	if r.Config.Repeat < 2 {
		return ""
	}
	return fmt.Sprintf(", repetition %d", rep)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func orNone(s string) string {
	if s == "" {
		return "no requests"
	}
	return s
}

// ownShare is what matbus and nats-server spent of CPU over a phase ÷
// what kube-apiserver spent (per Service written, the Services cancel
// out); nil when the API server's was not measured.
func ownShare(u *load.CPUUse) *float64 {
	if u == nil || u.ByProg["kube-apiserver"] <= 0 {
		return nil
	}
	return ptr((u.ByProg[roleMatbus] + u.ByProg["nats-server"]) / u.ByProg["kube-apiserver"])
}

// cpuRow is the CPU milliseconds one program spent per deleted Service
// during the delete fan-out (floor: the raw deletes), from load.CPUUse.
func cpuRow(prog string) rowDef {
	per := func(u *load.CPUUse, n int) *float64 {
		if u == nil || n == 0 {
			return nil
		}
		return ptr(u.ByProg[prog] * 1000 / float64(n))
	}
	return rowDef{"4. CPU per deleted Service, " + prog, "ms",
		func(f *floorResult) *float64 {
			if f.Delete.TimedOut || f.Delete.Failed > 0 {
				return nil
			}
			return per(f.DeleteCPU, f.Services)
		},
		func(x *roundResult) (*float64, string) {
			if x.Delete == nil || x.Delete.TimedOut {
				return nil, ""
			}
			return per(x.DeleteCPU, x.Delete.Count), ""
		}}
}
