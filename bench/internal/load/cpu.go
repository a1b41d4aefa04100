package load

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/procfs"
)

// CPUUse is CPU time spent over one phase: seconds of user+system time by
// program (the kernel's comm: kube-apiserver, etcd, nats-server, matbus, and
// the harness itself as "harness"; or the name SampleCPUNamed gives a
// process), summed over the harness and every process it started; Busy is the whole machine's busy CPU seconds over the
// same wall time (other programs' load shows as Busy above the sum).
type CPUUse struct {
	Wall   float64            `json:"wall_seconds"`
	Busy   float64            `json:"machine_busy_seconds"`
	ByProg map[string]float64 `json:"by_program_seconds"`
}

// CPUSample is one reading of the CPU counters (SampleCPU); Since turns
// two readings into a CPUUse.
type CPUSample struct {
	byProg map[string]float64
	busy   float64
	name   func(pid int) string
}

// SampleCPU reads the CPU seconds of the harness and its descendants from
// /proc (prometheus/procfs), grouped by program, and the machine's busy
// seconds from /proc/stat. Errors: /proc unreadable (not Linux).
func SampleCPU() (CPUSample, error) { return SampleCPUNamed(nil) }

// SampleCPUNamed is SampleCPU with the program of each process named by
// name(pid) where it answers non-empty, instead of by its comm (the file
// name of its binary): a process the caller started for a role is then
// counted under that role whatever its binary is called. The harness
// itself stays "harness". Since reads again with the same name.
func SampleCPUNamed(name func(pid int) string) (CPUSample, error) {
	s := CPUSample{byProg: map[string]float64{}, name: name}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return s, fmt.Errorf("open /proc: %w", err)
	}
	st, err := fs.Stat()
	if err != nil {
		return s, fmt.Errorf("read /proc/stat: %w", err)
	}
	c := st.CPUTotal // guest time is already counted in user
	s.busy = c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
	all, err := fs.AllProcs()
	if err != nil {
		return s, fmt.Errorf("list /proc: %w", err)
	}
	type st1 struct {
		comm string
		ppid int
		cpu  float64
	}
	procs := map[int]st1{}
	for _, p := range all {
		ps, err := p.Stat()
		if err != nil {
			continue // exited meanwhile
		}
		procs[p.PID] = st1{ps.Comm, ps.PPID, ps.CPUTime()}
	}
	self := os.Getpid()
	for pid, p := range procs {
		anc, ok := pid, false
		for range 64 { // depth bound: a cycle cannot happen, a reused pid can
			if anc == self {
				ok = true
				break
			}
			q, found := procs[anc]
			if !found || anc <= 1 {
				break
			}
			anc = q.ppid
		}
		if !ok {
			continue
		}
		prog := p.comm
		if name != nil {
			if n := name(pid); n != "" {
				prog = n
			}
		}
		if pid == self {
			prog = "harness"
		}
		s.byProg[prog] += p.cpu
	}
	return s, nil
}

// Since is the CPU use from s to now over wall seconds; nil when /proc
// cannot be read.
func (s CPUSample) Since(wall float64) *CPUUse {
	now, err := SampleCPUNamed(s.name)
	if err != nil || s.byProg == nil {
		return nil
	}
	u := &CPUUse{Wall: wall, Busy: now.busy - s.busy, ByProg: map[string]float64{}}
	for k, v := range now.byProg {
		if d := v - s.byProg[k]; d > 0 {
			u.ByProg[k] = d
		}
	}
	return u
}

// String is "kube-apiserver 40.1 s, etcd 12.0 s, …; machine busy 1.8 of
// the wall's cores" style, largest first.
func (u *CPUUse) String() string {
	if u == nil {
		return "not measured"
	}
	keys := make([]string, 0, len(u.ByProg))
	for k := range u.ByProg {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return u.ByProg[keys[i]] > u.ByProg[keys[j]] })
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.1f s", k, u.ByProg[k])
	}
	fmt.Fprintf(&b, "; machine busy %.2f cores over %.1f s", u.Busy/max(u.Wall, 1e-9), u.Wall)
	return b.String()
}
