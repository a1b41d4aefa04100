package faulttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/operator"
)

// The NATS identities of deploy/nats/ as shipped: nats-server runs with the
// file itself (flags override its port, store and name), discovery and the
// workers with their own users, status, errors, plan and check with the
// reader. The server's log must show no permission violation through
// appear, sync, a single delete, an instance gone (clean-up and delete
// fan-out) and a leader change, and a violation for every forbidden
// publish the test tries afterwards.

// natsRoles are the users of deploy/nats/accounts.conf.
var natsRoles = []string{"discovery", "worker", "reader"}

// shippedNATSFile is the absolute path of deploy/nats/<name>.
func shippedNATSFile(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "deploy", "nats", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// passwordEnv returns a fresh password per role and the environment that
// gives them to nats-server (MATBUS_<ROLE>_PASSWORD).
func passwordEnv(t *testing.T) (map[string]natsIdent, []string) {
	t.Helper()
	idents := map[string]natsIdent{}
	var env []string
	for _, role := range natsRoles {
		b := make([]byte, 12)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		pw := hex.EncodeToString(b)
		idents[role] = natsIdent{user: role, password: pw}
		env = append(env, "MATBUS_"+strings.ToUpper(role)+"_PASSWORD="+pw)
	}
	return idents, env
}

// newPermWorld is a world on deploy/nats/<conf> as shipped (nodes 0: one
// server, else a cluster of that many), its processes connected as their
// roles and the test as the reader.
func newPermWorld(t *testing.T, conf string, nodes int) *world {
	t.Helper()
	requireSetup(t)
	idents, env := passwordEnv(t)
	env = append(env, "NATS_SERVER_NAME=overridden-by-flag")
	r := idents["reader"]
	auth := natsAuth{conf: shippedNATSFile(t, conf), env: env, opts: []nats.Option{nats.UserInfo(r.user, r.password)}}
	return newWorldOn(t, nodes, auth, idents)
}

// TestNATSPermissionsAsShipped runs the pipeline on deploy/nats/nats-server.conf.
func TestNATSPermissionsAsShipped(t *testing.T) {
	w := newPermWorld(t, "nats-server.conf", 0)
	runPermScenario(w)
}

// TestNATSPermissionsClusterAsShipped runs it on three servers of
// deploy/nats/nats-server-cluster.conf, every stream with three replicas.
func TestNATSPermissionsClusterAsShipped(t *testing.T) {
	w := newPermWorld(t, "nats-server-cluster.conf", 3)
	runPermScenario(w)
}

// TestNATSPermissionsOperatorMode runs it on a server in operator (JWT)
// mode: an operator, a system account and the MATBUS account, whose users'
// JWTs carry the permissions of deploy/nats/accounts.conf as the server
// reads them, from a memory resolver.
func TestNATSPermissionsOperatorMode(t *testing.T) {
	requireSetup(t)
	dir := t.TempDir()
	perms := shippedPermissions(t)
	conf, creds := operatorSetup(t, dir, perms)
	auth := natsAuth{conf: conf, opts: []nats.Option{nats.UserCredentials(creds["reader"])}}
	idents := map[string]natsIdent{}
	for role, path := range creds {
		idents[role] = natsIdent{creds: path}
	}
	w := newWorldOn(t, 0, auth, idents)
	runPermScenario(w)
}

// shippedPermissions returns the permissions nats-server reads for each
// user of deploy/nats/nats-server.conf.
func shippedPermissions(t *testing.T) map[string]*server.Permissions {
	t.Helper()
	_, env := passwordEnv(t)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(shippedNATSFile(t, "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*server.Permissions{}
	for _, u := range opts.Users {
		if u.Account == nil || u.Account.Name != "MATBUS" {
			t.Fatalf("user %s is not in account MATBUS", u.Username)
		}
		out[u.Username] = u.Permissions
	}
	for _, role := range natsRoles {
		if out[role] == nil || out[role].Publish == nil || out[role].Subscribe == nil {
			t.Fatalf("deploy/nats: user %s has no publish or subscribe permissions", role)
		}
	}
	if len(out) != len(natsRoles) {
		t.Fatalf("deploy/nats: users %v, want %v", slices.Sorted(maps.Keys(out)), natsRoles)
	}
	return out
}

// operatorSetup writes an operator-mode server configuration into dir
// (operator JWT, system account, memory resolver preloaded with the system
// and MATBUS accounts; MATBUS with JetStream) and a credentials file per
// user of perms, whose JWT carries exactly those permissions. It returns
// the configuration's path and the credentials' paths by user.
func operatorSetup(t *testing.T, dir string, perms map[string]*server.Permissions) (string, map[string]string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, err := okp.PublicKey()
	must(err)
	account := func(name string) (nkeys.KeyPair, *jwt.AccountClaims) {
		kp, err := nkeys.CreateAccount()
		must(err)
		pub, err := kp.PublicKey()
		must(err)
		c := jwt.NewAccountClaims(pub)
		c.Name = name
		return kp, c
	}
	_, sys := account("SYS")
	akp, acct := account("MATBUS")
	acct.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "matbus-test"
	oc.SystemAccount = sys.Subject
	ojwt, err := oc.Encode(okp)
	must(err)
	sysJWT, err := sys.Encode(okp)
	must(err)
	acctJWT, err := acct.Encode(okp)
	must(err)
	creds := map[string]string{}
	for user, p := range perms {
		ukp, err := nkeys.CreateUser()
		must(err)
		upub, err := ukp.PublicKey()
		must(err)
		uc := jwt.NewUserClaims(upub)
		uc.Name = user
		uc.Pub.Allow.Add(p.Publish.Allow...)
		uc.Pub.Deny.Add(p.Publish.Deny...)
		uc.Sub.Allow.Add(p.Subscribe.Allow...)
		uc.Sub.Deny.Add(p.Subscribe.Deny...)
		ujwt, err := uc.Encode(akp)
		must(err)
		seed, err := ukp.Seed()
		must(err)
		b, err := jwt.FormatUserConfig(ujwt, seed)
		must(err)
		path := filepath.Join(dir, user+".creds")
		must(os.WriteFile(path, b, 0o600))
		creds[user] = path
	}
	conf := fmt.Sprintf("operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %s\n  %s: %s\n}\n",
		ojwt, sys.Subject, sys.Subject, sysJWT, acct.Subject, acctJWT)
	path := filepath.Join(dir, "operator.conf")
	must(os.WriteFile(path, []byte(conf), 0o600))
	return path, creds
}

// natsProcs returns the nats-server processes of w.
func (w *world) natsProcs() []*natsProc {
	if w.cluster != nil {
		return w.cluster.nodes
	}
	return []*natsProc{w.nats}
}

var violationRe = regexp.MustCompile(`(Publish|Subscription) Violation - (?:Subject|Reply) "([^"]+)"`)

// violations returns the subjects of every permission violation the
// servers of w logged so far, with how often.
func (w *world) violations() map[string]int {
	out := map[string]int{}
	for _, n := range w.natsProcs() {
		n.p.log.mu.Lock()
		for _, line := range n.p.log.lines {
			if m := violationRe.FindStringSubmatch(line); m != nil {
				out[m[1]+" "+m[2]]++
			} else if strings.Contains(line, "Violation") {
				out["unparsed: "+line]++
			}
		}
		n.p.log.mu.Unlock()
	}
	return out
}

// authErrors counts the servers' log lines of refused connections.
func (w *world) authErrors() int {
	n := 0
	for _, s := range w.natsProcs() {
		n += s.p.log.Count("Authorization Error") + s.p.log.Count("authentication error")
	}
	return n
}

// runMatbus runs the matbus binary with args (at most 2 min) and returns
// its output and exit code.
func (w *world) runMatbus(args ...string) (stdout, stderr string, code int) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, matbusBin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		w.t.Fatalf("matbus %s: %v", args[0], err)
	}
	return out.String(), errOut.String(), code
}

// readStatus runs `matbus status -o json` as the reader.
func (w *world) readStatus() *operator.Status {
	w.t.Helper()
	out, errOut, code := w.runMatbus(append([]string{"status", "--kubeconfig", cluster.Kubeconfig, "--namespace", w.ns,
		"-o", "json", "--log-level", "warn"}, w.natsArgsAs("reader")...)...)
	if code != 0 {
		w.t.Fatalf("matbus status: exit %d\n%s%s", code, out, errOut)
	}
	var st operator.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		w.t.Fatalf("matbus status output: %v\n%s", err, out)
	}
	return &st
}

// statusComplete reports whether st shows every one of keys with the
// leader's view (in rotation, a last good sync, a worker), leader as the
// live discovery leader, both job consumers, and nothing unreadable.
func statusComplete(st *operator.Status, leader string, keys ...string) (bool, string) {
	sum := st.Summary
	if len(sum.Unknown) > 0 {
		return false, fmt.Sprintf("unknown: %v", sum.Unknown)
	}
	if sum.Leader == nil || sum.Leader.Identity != "discovery/"+leader || sum.LeaderStale || !sum.Leader.Ended.IsZero() {
		return false, fmt.Sprintf("leader %+v, want discovery/%s live", sum.Leader, leader)
	}
	if len(sum.Consumers) != 2 {
		return false, fmt.Sprintf("consumers %+v", sum.Consumers)
	}
	rows := map[string]operator.StatusRow{}
	for _, r := range st.Rows {
		rows[r.Instance] = r
	}
	for _, k := range keys {
		r, ok := rows[k]
		if !ok {
			return false, k + ": no row"
		}
		if r.State == nil || !r.State.InRotation || r.State.LastGoodSync.IsZero() || r.State.Worker == "" {
			return false, fmt.Sprintf("%s: state %+v", k, r.State)
		}
	}
	return true, ""
}

// runPermScenario is the pipeline's life on w: three workers and two
// discovery processes; two instances appear and sync; one restarts with an
// empty inventory (its deletes held, then its devices back); a device goes
// (one delete job); an instance goes (clean-up, delete fan-out); the leader
// stops and the other takes over, and a third instance appears. status,
// errors, plan and check run as the reader on the way. Then no violation
// may be in the server logs. Last, the worker and the reader try what
// they may not, and each try is refused.
func runPermScenario(w *world) {
	t := w.t
	a := w.newInstance("mat-a", fleetSpec{hosts: 10, switches: 1}, 0)
	b := w.newInstance("mat-b", fleetSpec{hosts: 3, switches: 1}, 0)
	c := w.newInstance("mat-c", fleetSpec{hosts: 2}, 0)
	w.discover(a)
	w.discover(b)
	for _, name := range []string{"w1", "w2", "w3"} {
		w.startWorker(name)
	}
	discs := map[string]*proc{"disc-1": w.startDiscovery("disc-1"), "disc-2": w.startDiscovery("disc-2")}
	holder := func() string {
		l, err := adminKube.CoordinationV1().Leases(w.ns).Get(w.ctx, "matbus-discovery", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	w.waitFor("a leader", 30*time.Second, func() (bool, string) { return holder() != "", "no holder" })
	leader := holder()
	a.waitConverged(time.Minute)
	b.waitConverged(time.Minute)

	// status shows the leader's view of every instance: its state bucket
	// entries were written.
	var st *operator.Status
	w.waitFor("status shows the leader's view", time.Minute, func() (bool, string) {
		st = w.readStatus()
		return statusComplete(st, leader, a.key(), b.key())
	})

	planArgs := append([]string{"plan", "--kubeconfig", cluster.Kubeconfig, "--namespace", w.ns, "--mat-scheme", "http",
		"--service-cidr", cluster.ServiceCIDR, "--log-level", "warn"}, w.natsArgsAs("reader")...)

	// mat-a restarts: an empty inventory under a new epoch. A worker holds
	// its deletes (the state bucket's hold record), status and plan show
	// the hold, and the devices come back: the hold ends, every Service
	// kept.
	uids := uidsOf(a.services())
	full := a.sim.Fleet()
	empty := full.Clone()
	empty.Machines = nil
	if err := a.sim.Restart("", empty); err != nil {
		t.Fatal(err)
	}
	w.waitFor("status shows mat-a's deletes held", time.Minute, func() (bool, string) {
		st = w.readStatus()
		for _, r := range st.Rows {
			if r.Instance == a.key() && r.Hold != nil && r.Hold.Released.IsZero() && r.Hold.Held == len(uids) {
				return len(st.Summary.Unknown) == 0, fmt.Sprintf("unknown: %v", st.Summary.Unknown)
			}
		}
		return false, "no hold of mat-a"
	})
	// Held deletes are no change (exit 0), shown with the hold record.
	if out, errOut, code := w.runMatbus(planArgs...); code != 0 || !strings.Contains(out, "deletes held until") {
		t.Errorf("matbus plan during the hold: exit %d, want 0 with the held deletes\n%s%s", code, out, errOut)
	}
	if err := a.sim.Restart("", full); err != nil {
		t.Fatal(err)
	}
	w.waitFor("mat-a's hold ends", time.Minute, func() (bool, string) {
		st = w.readStatus()
		for _, r := range st.Rows {
			if r.Instance == a.key() && r.Hold != nil && r.Hold.Released.IsZero() {
				return false, "still held"
			}
		}
		return true, ""
	})
	if got := uidsOf(a.waitConverged(time.Minute)); !maps.Equal(got, uids) {
		t.Errorf("mat-a's Services changed through its restart")
	}

	// One device goes: one delete job.
	var sw string
	for _, m := range a.fleet.Machines {
		if m.Kind == matclient.KindSwitch && m.BMC.IP != "" {
			sw = m.MatID
		}
	}
	if sw == "" {
		t.Fatal("mat-a has no switch")
	}
	if err := a.sim.RemoveDevice(sw); err != nil {
		t.Fatal(err)
	}
	a.waitConverged(time.Minute)

	// An instance goes: a clean-up job and a delete job per Service.
	w.undiscover(b)
	b.waitGone(time.Minute)

	// errors, plan and check as the reader.
	if out, errOut, code := w.runMatbus(append([]string{"errors", "--since", "1h", "--follow=false"}, w.natsArgsAs("reader")...)...); code != 0 {
		t.Errorf("matbus errors: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := w.runMatbus(planArgs...); code != 0 && code != 2 {
		t.Errorf("matbus plan: exit %d\n%s%s", code, out, errOut)
	}
	checkArgs := append([]string{"check", "--kubeconfig", cluster.Kubeconfig, "--namespace", w.ns, "--mat-scheme", "http",
		"--service-cidr", cluster.ServiceCIDR, "--log-level", "warn"}, w.natsArgsAs("reader")...)
	if out, errOut, _ := w.runMatbus(checkArgs...); !strings.Contains(out, "JetStream enabled") {
		t.Errorf("matbus check as the reader: no working JetStream row\n%s%s", out, errOut)
	}

	// The leader stops; the other process takes over and publishes.
	follower := "disc-1"
	if leader == "disc-1" {
		follower = "disc-2"
	}
	if _, code := discs[leader].Term(30 * time.Second); code != 0 {
		t.Errorf("%s: exit status %d after SIGTERM", leader, code)
	}
	w.waitFor(follower+" takes the Lease", time.Minute, func() (bool, string) { h := holder(); return h == follower, "holder " + h })
	w.discover(c)
	c.waitConverged(time.Minute)
	w.waitFor("status shows the new leader's view", time.Minute, func() (bool, string) {
		st = w.readStatus()
		return statusComplete(st, follower, a.key(), c.key())
	})
	if out, _, code := w.runMatbus(append([]string{"status", "--kubeconfig", cluster.Kubeconfig, "--namespace", w.ns}, w.natsArgsAs("reader")...)...); code != 0 || strings.Contains(out, "no discovery leader") {
		t.Errorf("matbus status (text): exit %d\n%s", code, out)
	}

	if v := w.violations(); len(v) > 0 {
		t.Errorf("permission violations in the server log through the scenario: %v", v)
	}
	if n := w.authErrors(); n > 0 {
		t.Errorf("%d refused connections in the server log", n)
	}
	t.Logf("measured: %d permission violations through appear, sync, a MAT restart (deletes held, devices back), a device delete, an instance gone (%d delete jobs), a leader change, status, errors, plan and check",
		len(w.violations()), len(b.want()))

	// What the identities may not do.
	tries := []refusal{
		{role: "worker", subject: w.bus.Subjects().Instance(w.key("forged")), what: "an instance event"},
		{role: "worker", subject: w.bus.Subjects().Sync(a.key()), what: "a sync job"},
		{role: "worker", subject: "$JS.API.STREAM.UPDATE." + w.bus.StreamName(events.StreamInstances), what: "an instances stream update", body: streamBody(w, "INSTANCES")},
		{role: "worker", subject: "$JS.API.STREAM.DELETE." + w.bus.StreamName(events.StreamInstances), what: "a stream delete"},
		{role: "worker", subject: "$KV.MAT_STATE." + events.StateLeaderKey(w.ns), what: "the leader entry"},
		{role: "reader", subject: w.bus.Subjects().Error("x"), what: "an error event"},
		{role: "reader", subject: w.bus.Subjects().Delete(a.key()), what: "a delete job"},
		{role: "reader", subject: w.bus.Subjects().Result(a.key()), what: "a sync result"},
		{role: "reader", subject: "$JS.API.STREAM.DELETE." + w.bus.StreamName(events.StreamErrors), what: "a stream delete"},
		{role: "reader", subject: "$JS.API.STREAM.PURGE." + w.bus.StreamName(events.StreamInstances), what: "a stream purge"},
		{role: "reader", subject: "$JS.API.CONSUMER.CREATE." + w.bus.StreamName(events.StreamSync) + ".thief", what: "a job consumer"},
		{role: "reader", subject: "$KV.MAT_STATE." + events.StateLeaderKey(w.ns), what: "the leader entry"},
	}
	for _, r := range tries {
		w.tryRefused(r)
	}
	// The worker's bus refuses the same, through the real publish path.
	wnc := w.connectAs("worker", nil)
	wbus, err := events.New(wnc, events.Config{Source: "worker/forger", Namespace: w.ns, KeepStreams: true}, w.log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(w.ctx, 3*time.Second)
	err = wbus.Publish(ctx, wbus.Subjects().Instance(a.key()), events.TypeInstanceGone, "forged-gone", events.Instance{Key: a.key(), URL: a.url})
	cancel()
	if err == nil {
		t.Errorf("the worker identity published a gone event of %s", a.key())
	}
	tries = append(tries, refusal{role: "worker", subject: wbus.Subjects().Instance(a.key()), what: "gone event, through events.Bus.Publish"})
	got := w.violations()
	want := map[string]bool{}
	for _, r := range tries {
		want["Publish "+r.subject] = true
		if got["Publish "+r.subject] == 0 {
			t.Errorf("no violation logged for the %s's %s (%s)", r.role, r.what, r.subject)
		}
	}
	for v := range got {
		if !want[v] {
			t.Errorf("unexpected violation: %s", v)
		}
	}
	t.Logf("measured: %d forbidden publishes tried (worker: instance events, a sync job, stream update and delete, the leader entry; reader: an error event, a delete job, a result, stream delete and purge, a job consumer, the leader entry), %d refused by the server",
		len(tries), len(tries)-countMissing(got, tries))

	// Nothing of it took effect.
	for _, s := range []string{"INSTANCES", "ERRORS"} {
		if _, err := w.js.Stream(w.ctx, w.bus.StreamName(events.Role(s))); err != nil {
			t.Errorf("stream %s: %v", s, err)
		}
	}
	if _, found, err := w.bus.LastInstance(w.ctx, w.key("forged")); err != nil || found {
		t.Errorf("forged instance record: found %v, %v", found, err)
	}
	if rec, _, err := w.bus.LastInstance(w.ctx, a.key()); err != nil || !rec.Present() {
		t.Errorf("%s: %+v, %v; want present", a.key(), rec, err)
	}
	time.Sleep(2 * syncInterval)
	a.waitConverged(10 * time.Second)
}

func countMissing(got map[string]int, tries []refusal) int {
	n := 0
	for _, r := range tries {
		if got["Publish "+r.subject] == 0 {
			n++
		}
	}
	return n
}

// refusal is a publish role's identity may not make.
type refusal struct {
	role, subject, what string
	body                []byte
}

// streamBody is a valid configuration of the stream of role: an update
// with it would be accepted, were it allowed.
func streamBody(w *world, role string) []byte {
	for _, c := range w.bus.StreamConfigs() {
		if c.Name == w.bus.StreamName(events.Role(role)) {
			c.MaxAge = time.Second
			b, err := json.Marshal(c)
			if err != nil {
				w.t.Fatal(err)
			}
			return b
		}
	}
	w.t.Fatalf("no stream %s", role)
	return nil
}

// connectAs connects as role; errs, when set, receives the connection's
// asynchronous errors.
func (w *world) connectAs(role string, errs chan<- error) *nats.Conn {
	w.t.Helper()
	id := w.idents[role]
	opts := []nats.Option{nats.Name("faulttest-" + role)}
	if id.creds != "" {
		opts = append(opts, nats.UserCredentials(id.creds))
	} else {
		opts = append(opts, nats.UserInfo(id.user, id.password))
	}
	if errs != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	}
	nc, err := nats.Connect(strings.Split(w.natsURL(), ",")[0], opts...)
	if err != nil {
		w.t.Fatalf("connect as %s: %v", role, err)
	}
	w.onStop(nc.Close)
	return nc
}

// tryRefused publishes r (as a request) as its role and waits for the
// server's permissions error.
func (w *world) tryRefused(r refusal) {
	w.t.Helper()
	errs := make(chan error, 4)
	nc := w.connectAs(r.role, errs)
	defer nc.Close()
	body := r.body
	if body == nil {
		body = []byte("{}")
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: r.subject, Reply: nc.NewRespInbox(), Data: body}); err != nil {
		w.t.Fatalf("publish %s: %v", r.subject, err)
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), r.subject) {
			w.t.Errorf("the %s's %s (%s): error %v, want a permissions violation", r.role, r.what, r.subject, err)
		}
	case <-time.After(5 * time.Second):
		w.t.Errorf("the %s's %s (%s) was not refused", r.role, r.what, r.subject)
	}
}
