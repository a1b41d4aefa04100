package devenv

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/operator"
	"github.com/matbus/matbus/plan"
)

// Steps is what the next-step commands of a dev run need to know.
type Steps struct {
	NATSURL, Namespace, Kubeconfig string
	// SourcesURL is the sources API's base URL; empty when it is off.
	SourcesURL string
	Entries    []discovery.StaticEntry
	// Flags are the flags of dev that status, plan and check take too,
	// as --name=value, ready to append.
	Flags []string
}

// NextSteps returns the "Next steps" block dev prints once its Services
// are in place: status, errors, plan, check and kubectl, and a curl that
// makes the last simulator fail (matsim.FaultPath), each a command line
// with this run's addresses that can be pasted as it is (run from the
// repository root, where `make build` puts bin/matbus). The README shows
// the same block.
func NextSteps(r Steps) string {
	kc := ShellQuote(r.Kubeconfig)
	var static []string
	for _, e := range r.Entries {
		static = append(static, e.Name+"="+e.URL)
	}
	instances := "--namespace " + ShellQuote(r.Namespace) + " --static " + ShellQuote(strings.Join(static, ","))
	extra := ""
	for _, f := range r.Flags {
		extra += " " + ShellQuote(f)
	}
	status := "bin/matbus status --nats-url " + r.NATSURL + " --namespace " + ShellQuote(r.Namespace) + " --kubeconfig " + kc + extra
	if r.SourcesURL != "" {
		status += " --sources-url " + r.SourcesURL
	}
	var b strings.Builder
	b.WriteString("Next steps (in another terminal, from this folder; Ctrl-C here stops the pipeline):\n")
	for _, c := range []struct{ what, cmd string }{
		{"one row per instance, the Services, the jobs, the discovery leader", status},
		{"error events of the last hour, then new ones as they come (Ctrl-C stops)", "bin/matbus errors --nats-url " + r.NATSURL + " --since 1h" + prefixFlag(r.Flags)},
		{"what a worker would change (nothing, once in step); writes nothing", "bin/matbus plan --kubeconfig " + kc + " " + instances + " --insecure-skip-verify" + extra},
		{"pre-flight: NATS, Kubernetes API, RBAC, MAT status, IP ranges", "bin/matbus check --nats-url " + r.NATSURL + " --kubeconfig " + kc + " " + instances + " --insecure-skip-verify" + extra},
		{"the Services themselves", "KUBECONFIG=" + kc + " kubectl get svc -n " + ShellQuote(r.Namespace) + " -l " + plan.LabelManagedBy + "=" + managedBy(r.Flags)},
	} {
		fmt.Fprintf(&b, "  # %s\n  %s\n", c.what, c.cmd)
	}
	if n := len(r.Entries); n > 0 {
		last := r.Entries[n-1]
		fmt.Fprintf(&b, "  # make %s fail (its status requests answer 500), then run status again; --data none heals it\n  curl -sSk -X PUT --data 500 %s\n",
			last.Name, last.URL+matsim.FaultPath)
	}
	return b.String()
}

// prefixFlag returns " --subject-prefix=X" when flags hold one, else "".
func prefixFlag(flags []string) string {
	for _, f := range flags {
		if strings.HasPrefix(f, "--subject-prefix=") {
			return " " + ShellQuote(f)
		}
	}
	return ""
}

// managedBy returns the --managed-by value in flags, else the default.
func managedBy(flags []string) string {
	for _, f := range flags {
		if v, ok := strings.CutPrefix(f, "--managed-by="); ok {
			return ShellQuote(v)
		}
	}
	return plan.DefaultManagedBy
}

// ShellQuote returns s as one POSIX shell word: as it is when it holds
// only characters no shell treats specially, else in single quotes.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// LogFile returns where dev's process logs go: stderr when verbose, else
// a new file in the temporary folder, which is kept after the run (its
// path is returned, to be printed) so that a failed run can be read;
// closeFn removes it when nothing was logged. The output stays for what
// dev prints itself: each Service change and each error event, once.
func LogFile(verbose bool, stderr io.Writer) (w io.Writer, path string, closeFn func(), err error) {
	if verbose {
		return stderr, "", func() {}, nil
	}
	f, err := os.CreateTemp("", "matbus-dev-*.log")
	if err != nil {
		return nil, "", nil, fmt.Errorf("process log file (or run with -v): %w", err)
	}
	return f, f.Name(), func() {
		// A run that logged nothing (e.g. a refused flag) leaves no file.
		if fi, err := f.Stat(); err == nil && fi.Size() == 0 {
			_ = os.Remove(f.Name())
		}
		_ = f.Close()
	}, nil
}

// ipTakenHint follows the first error event of a BMC or NVOS IP that
// another Service holds: on a cluster shared with another fleet (another
// `dev`, or real BMCs), the fix is another subnet.
const ipTakenHint = "HINT  another Service on this cluster holds that IP (another dev fleet, or real BMCs?): " +
	"start this one with other --bmc-subnet and --nvos-subnet (e.g. --bmc-subnet 10.104.64.0/20, whose NVOS IPs are 10.106.64.0/20) and another --seed\n"

// ipTaken reports whether error event data says that a cluster IP is
// allocated to another Service.
func ipTaken(data []byte) bool {
	return bytes.Contains(data, []byte("already allocated")) || bytes.Contains(data, []byte("is allocated to another"))
}

// errorWatch prints each error event once (a re-published event arrives
// twice) and keeps the counts --once decides by.
type errorWatch struct {
	out      io.Writer
	seen     map[string]bool // event ids printed; used by the subscription's goroutine only
	count    atomic.Int64
	ipHinted atomic.Bool // ipTakenHint printed
	// unix nanoseconds of the newest error event of each kind
	lastPermanent, lastTransient atomic.Int64
}

// handle is the subscription's handler of one error event.
func (e *errorWatch) handle(m *nats.Msg) {
	env, derr := events.Decode(m.Data)
	if derr == nil {
		if e.seen[env.ID] {
			return
		}
		if len(e.seen) > 10000 {
			clear(e.seen)
		}
		e.seen[env.ID] = true
		if ev, err := events.Into[events.Error](env, events.TypeError); err == nil && ev.Permanent {
			e.lastPermanent.Store(time.Now().UnixNano())
		} else {
			e.lastTransient.Store(time.Now().UnixNano())
		}
	}
	e.count.Add(1)
	var b bytes.Buffer
	b.WriteString("ERROR ")
	operator.WriteErrorEvent(&b, m.Subject, m.Data, false)
	if ipTaken(m.Data) && !e.ipHinted.Swap(true) {
		b.WriteString(ipTakenHint)
	}
	_, _ = e.out.Write(b.Bytes())
}

// syncWriter serialises writes from several goroutines to one writer.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
