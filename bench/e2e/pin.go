package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/prometheus/procfs"
)

// Pinning the control plane (--pin-control-plane, the default): on a real
// cluster the API server and etcd never share cores with the controllers
// that write to them. Here they do, unless the run splits the machine: the
// API server and etcd get the first half of the CPUs (at least one), the
// harness and everything it starts after them — the floor's client-go,
// nats-server, the matbus processes, the simulators — the rest. The floor
// runs on the same split, so each ratio compares matbus with raw client-go
// against an API server of the same size, and matbus's own CPU no longer
// takes the API server's. A process that may use fewer than 2 CPUs has
// nothing to split: the run is then unpinned and says so.

// errFewCPUs: this process may use fewer than 2 CPUs.
var errFewCPUs = errors.New("pinning needs at least 2 CPUs")

// pinPlan is the CPU split: control-plane CPUs and the others.
type pinPlan struct {
	Control []int `json:"control_plane_cpus"`
	Rest    []int `json:"other_cpus"`
}

// newPinPlan splits the CPUs this process may run on. Errors: fewer
// than 2 CPUs (errFewCPUs), or the affinity mask unreadable.
func newPinPlan() (*pinPlan, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("read the CPU affinity: %w", err)
	}
	var cpus []int
	for i := 0; i < runtime.NumCPU()*4 && len(cpus) < set.Count(); i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		return nil, fmt.Errorf("%w, this process may use %d", errFewCPUs, len(cpus))
	}
	n := max(len(cpus)/2, 1)
	return &pinPlan{Control: cpus[:n], Rest: cpus[n:]}, nil
}

func (p *pinPlan) String() string {
	return fmt.Sprintf("kube-apiserver and etcd on CPU %v, the harness, nats-server, matbus and the simulators on CPU %v", p.Control, p.Rest)
}

// choosePin decides the run's CPUs: a split when want (--pin-control-plane)
// and the process may use 2 CPUs or more, else nil and why the run is
// unpinned. Errors: the affinity mask unreadable.
func choosePin(want bool) (*pinPlan, string, error) {
	if !want {
		return nil, "--pin-control-plane=false", nil
	}
	pp, err := newPinPlan()
	if errors.Is(err, errFewCPUs) {
		return nil, err.Error(), nil
	}
	return pp, "", err
}

// cpusLine says how the run uses the CPUs: pinned and how, or unpinned
// and why (the first line of the log and of the table).
func cpusLine(pp *pinPlan, unpinned string) string {
	if pp != nil {
		return "control plane pinned: " + pp.String()
	}
	line := "control plane unpinned: every process may run on any CPU"
	if unpinned != "" {
		line = fmt.Sprintf("control plane unpinned (%s): every process may run on any CPU", unpinned)
	}
	return line
}

// apply pins every thread of the harness's kube-apiserver and etcd
// processes to the control-plane CPUs, then every thread of the harness
// to the others; processes it starts later inherit that mask.
func (p *pinPlan) apply() error {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return err
	}
	all, err := fs.AllProcs()
	if err != nil {
		return err
	}
	self := os.Getpid()
	found := map[string]bool{}
	for _, pr := range all {
		st, err := pr.Stat()
		if err != nil || st.PPID != self || (st.Comm != "kube-apiserver" && st.Comm != "etcd") {
			continue
		}
		if err := pinAllThreads(pr.PID, p.Control); err != nil {
			return fmt.Errorf("pin %s: %w", st.Comm, err)
		}
		found[st.Comm] = true
	}
	if !found["kube-apiserver"] || !found["etcd"] {
		return errors.New("pin: kube-apiserver or etcd is not a child of the harness")
	}
	return pinAllThreads(self, p.Rest)
}

// pinAllThreads sets the affinity of every thread of pid (a thread's
// affinity is its own; new threads inherit their creator's).
func pinAllThreads(pid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	return nil
}
