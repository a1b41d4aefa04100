package main

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// clockTicks is the unit of utime/stime in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux this runs on).
const clockTicks = 100

// cpuUse is CPU time spent over one phase: seconds of user+system time by
// program (the kernel's comm: kube-apiserver, etcd, nats-server, matbus, and
// the harness itself as "harness"), summed over the harness and every
// process it started; Busy is the whole machine's busy CPU seconds over the
// same wall time (other programs' load shows as Busy above the sum).
type cpuUse struct {
	Wall   float64            `json:"wall_seconds"`
	Busy   float64            `json:"machine_busy_seconds"`
	ByProg map[string]float64 `json:"by_program_seconds"`
}

// cpuSample is one reading of cpu counters.
type cpuSample struct {
	byProg map[string]float64
	busy   float64
}

// sampleCPU reads the CPU seconds of the harness and its descendants from
// /proc, grouped by program, and the machine's busy seconds from /proc/stat.
// Errors: /proc unreadable (not Linux).
func sampleCPU() (cpuSample, error) {
	s := cpuSample{byProg: map[string]float64{}}
	busy, err := machineBusy()
	if err != nil {
		return s, err
	}
	s.busy = busy
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return s, fmt.Errorf("read /proc: %w", err)
	}
	type st struct {
		comm string
		ppid int
		cpu  float64
	}
	procs := map[int]st{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		comm, ppid, cpu, ok := parseStat(b)
		if ok {
			procs[pid] = st{comm, ppid, cpu}
		}
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
		name := p.comm
		if pid == self {
			name = "harness"
		}
		s.byProg[name] += p.cpu
	}
	return s, nil
}

// parseStat reads comm, ppid and utime+stime (seconds) from the content of
// /proc/<pid>/stat; comm may hold spaces and parentheses, so fields are
// counted from the last ')'.
func parseStat(b []byte) (comm string, ppid int, cpu float64, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, 0, false
	}
	comm = string(b[open+1 : end])
	f := strings.Fields(string(b[end+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return "", 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseFloat(f[11], 64)
	stm, err3 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return "", 0, 0, false
	}
	return comm, ppid, (ut + stm) / clockTicks, true
}

// machineBusy is the machine's busy CPU seconds since boot: the first line
// of /proc/stat minus idle and iowait.
func machineBusy() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 6 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var total, idle float64
	for i, v := range f[1:] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i >= 8 { // guest time is already counted in user
			break
		}
		total += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	return (total - idle) / clockTicks, nil
}

// since is the CPU use from s to now over wall seconds; nil when /proc
// cannot be read.
func (s cpuSample) since(wall float64) *cpuUse {
	now, err := sampleCPU()
	if err != nil || s.byProg == nil {
		return nil
	}
	u := &cpuUse{Wall: wall, Busy: now.busy - s.busy, ByProg: map[string]float64{}}
	for k, v := range now.byProg {
		if d := v - s.byProg[k]; d > 0 {
			u.ByProg[k] = d
		}
	}
	return u
}

// String is "kube-apiserver 40.1 s, etcd 12.0 s, …; machine busy 1.8 of
// the wall's cores" style, largest first.
func (u *cpuUse) String() string {
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
