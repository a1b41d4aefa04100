package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/matbus/matbus/internal/redact"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
)

// lockedBuffer is a bytes.Buffer safe for the goroutines of an in-process subcommand.
type lockedBuffer = testenv.Buffer

func randomSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// authNATS starts an embedded JetStream server on port with a file store in
// dir, requiring opts' user/password or token.
func authNATS(t *testing.T, port int, dir string, user, password, token string) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir,
		Username: user, Password: password, Authorization: token, NoSigs: true, NoLog: true, ServerName: "matbus-secrets"})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	return s
}

func stopNATS(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

// proc is one subcommand run as a process of the built binary (several
// in one test process would share client-go's global klog logger).
type proc struct {
	name string
	out  *lockedBuffer
	cmd  *exec.Cmd
	done chan struct{}
}

// buildMatbus builds the binary into a temporary folder.
func buildMatbus(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "matbus")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build matbus: %v\n%s", err, out)
	}
	return bin
}

// startProc runs bin with args and only the environment variables vars
// (and PATH, HOME); output goes to p.out.
func startProc(t *testing.T, bin, name string, vars map[string]string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &lockedBuffer{}, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.halt(t) })
	return p
}

// halt sends SIGTERM and waits for the process to end (SIGKILL after 20 s).
func (p *proc) halt(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not stop within 20s of SIGTERM", p.name)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitFor polls cond every 200 ms until it holds or d has passed.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool, procs ...*proc) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, p := range procs {
				fmt.Fprintf(&b, "--- %s:\n%s\n", p.name, tail(p.out.String(), 40))
			}
			t.Fatalf("timed out after %s waiting for %s\n%s", d, what, b.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// linesWith returns the lines of s that contain every one of subs.
func linesWith(s string, subs ...string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		ok := l != ""
		for _, sub := range subs {
			ok = ok && strings.Contains(l, sub)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// TestNoSecretInLogsOrEvents runs the real discovery and worker subcommands
// with JSON logs against a NATS server that requires a password and a
// kube-apiserver that requires a bearer token, all three known random
// strings; through connect, a NATS restart (reconnect), a token-protected
// NATS, a wrong password, an unreachable server and a rejected bearer
// token. No log line and no error event may hold a secret, and the NATS
// lines must still name the host they talk to.
func TestNoSecretInLogsOrEvents(t *testing.T) {
	if _, err := kubelocal.FindBinaries(); errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := buildMatbus(t)

	password, natsToken, wrongPassword, wrongBearer := randomSecret(t), randomSecret(t), randomSecret(t), randomSecret(t)
	port, err := kubelocal.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	store := t.TempDir()
	ns := authNATS(t, port, store, "matbus", password, "")
	defer func() { stopNATS(ns) }()
	tokenPort, err := kubelocal.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	tokenNS := authNATS(t, tokenPort, t.TempDir(), "", "", natsToken)
	defer stopNATS(tokenNS)
	closedPort, err := kubelocal.FreePort()
	if err != nil {
		t.Fatal(err)
	}

	cl, err := kubelocal.Start(ctx, kubelocal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	bearer := cl.Token
	secrets := map[string]string{"NATS password": password, "NATS token": natsToken, "wrong NATS password": wrongPassword,
		"bearer token": bearer, "rejected bearer token": wrongBearer}
	kube, err := kubernetes.NewForConfig(cl.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	namespace := testenv.Namespace("sec", t.Name())
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A kubeconfig whose bearer token the API server rejects.
	kc, err := clientcmd.LoadFromFile(cl.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Token = wrongBearer
	}
	badKubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, badKubeconfig); err != nil {
		t.Fatal(err)
	}

	fleet, err := matsim.Generate(matsim.FleetSpec{Hosts: 2, Seed: 11})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := matsim.New(matsim.Options{Fleet: fleet})
	if err != nil {
		t.Fatal(err)
	}
	simURL, err := sim.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()

	host := "127.0.0.1:" + strconv.Itoa(port)
	natsURL := "nats://matbus:" + password + "@" + host
	base := map[string]string{"MATBUS_NATS_URL": natsURL, "KUBECONFIG": cl.Kubeconfig, "MATBUS_LOG_FORMAT": "json", "MATBUS_LOG_LEVEL": "debug"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	workerArgs := func(name string) []string {
		return []string{"worker", "--namespace", namespace, "--health-addr", "", "--worker-name", name,
			"--service-cidr", cl.ServiceCIDR, "--mat-timeout", "2s", "--shutdown-grace", "1s", "--error-window", "1s"}
	}
	disc := startProc(t, bin, "discovery", base, "discovery", "--namespace", namespace, "--health-addr", "", "--sync-interval", "2s",
		"--static", "mat-0="+simURL+",mat-dead=http://127.0.0.1:"+strconv.Itoa(closedPort), "--identity", "disc-0",
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "1s")
	wk := startProc(t, bin, "worker", base, workerArgs("w-0")...)
	mainProcs := []*proc{disc, wk}

	// Connect: the Services of mat-0 appear, error events for mat-dead are stored.
	waitFor(t, 2*time.Minute, "every BMC Service", func() bool {
		l, err := kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{LabelSelector: plan.LabelManagedBy + "=" + plan.DefaultManagedBy})
		return err == nil && len(l.Items) == sim.BMCs()
	}, mainProcs...)
	checker, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer checker.Close()
	js, err := jetstream.New(checker)
	if err != nil {
		t.Fatal(err)
	}
	errorEvents := func() []string {
		s, err := js.Stream(ctx, "MAT_ERRORS")
		if err != nil {
			return nil
		}
		var out []string
		for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
			if m, err := s.GetMsg(ctx, seq); err == nil {
				out = append(out, string(m.Data))
			}
		}
		return out
	}
	waitFor(t, time.Minute, "a fetch error event", func() bool { return len(errorEvents()) > 0 }, mainProcs...)

	// Reconnect: the server restarts on the same port and store.
	stopNATS(ns)
	ns = authNATS(t, port, store, "matbus", password, "")
	waitFor(t, time.Minute, "both processes to reconnect", func() bool {
		return len(linesWith(disc.out.String(), "NATS reconnected")) > 0 && len(linesWith(wk.out.String(), "NATS reconnected")) > 0
	}, mainProcs...)
	before := len(errorEvents())
	waitFor(t, time.Minute, "an error event after the restart", func() bool { return len(errorEvents()) > before }, mainProcs...)

	// Failures, side by side for a few seconds each.
	tokenURL := "nats://" + natsToken + "@127.0.0.1:" + strconv.Itoa(tokenPort)
	failures := []*proc{
		startProc(t, bin, "worker with a NATS token", with("MATBUS_NATS_URL", tokenURL), workerArgs("w-token")...),
		startProc(t, bin, "worker with a wrong password", with("MATBUS_NATS_URL", "nats://matbus:"+wrongPassword+"@"+host), workerArgs("w-wrong")...),
		startProc(t, bin, "discovery with a wrong password", with("MATBUS_NATS_URL", "nats://matbus:"+wrongPassword+"@"+host),
			"discovery", "--namespace", namespace, "--health-addr", "", "--static", "mat-0="+simURL, "--leader-elect=false"),
		startProc(t, bin, "worker with an unreachable server", with("MATBUS_NATS_URL", "nats://matbus:"+password+"@127.0.0.1:"+strconv.Itoa(closedPort)), workerArgs("w-unreachable")...),
		startProc(t, bin, "worker with a rejected bearer token", with("KUBECONFIG", badKubeconfig), workerArgs("w-unauthorized")...),
	}
	tokenWorker, wrongWorker, unreachable, unauthorized := failures[0], failures[1], failures[3], failures[4]
	waitFor(t, time.Minute, "the failures to be logged", func() bool {
		return len(linesWith(tokenWorker.out.String(), "NATS connected")) > 0 &&
			len(linesWith(wrongWorker.out.String(), "NATS refused the credentials")) > 0 &&
			len(linesWith(unreachable.out.String(), "NATS not reachable yet")) > 0 &&
			len(linesWith(unauthorized.out.String(), "Unauthorized")) > 0
	}, failures...)
	time.Sleep(2 * time.Second)
	for _, p := range append(mainProcs, failures...) {
		p.halt(t)
	}

	// No secret anywhere.
	for _, p := range append(mainProcs, failures...) {
		out := p.out.String()
		for what, s := range secrets {
			for _, l := range linesWith(out, s) {
				t.Errorf("%s logged the %s: %s", p.name, what, l)
			}
		}
	}
	evs := errorEvents()
	for _, ev := range evs {
		for what, s := range secrets {
			if strings.Contains(ev, s) {
				t.Errorf("error event holds the %s: %s", what, ev)
			}
		}
	}

	// The lines still say which host they talk to.
	for _, c := range []struct {
		p    *proc
		msg  string
		host string
	}{
		{disc, "NATS connected", host}, {wk, "NATS connected", host}, {disc, "NATS reconnected", host}, {wk, "NATS reconnected", host},
		{tokenWorker, "NATS connected", "127.0.0.1:" + strconv.Itoa(tokenPort)},
		{wrongWorker, "NATS not reachable yet", host}, {wrongWorker, "NATS refused the credentials", host},
		{failures[2], "NATS refused the credentials", host},
		{unreachable, "NATS not reachable yet", "127.0.0.1:" + strconv.Itoa(closedPort)},
	} {
		if len(linesWith(c.p.out.String(), c.msg, `"url":"nats://`+redact.UserInfoMarker+`@`+c.host+`"`)) == 0 {
			t.Errorf("%s: no %q line naming nats://***@%s:\n%s", c.p.name, c.msg, c.host, tail(c.p.out.String(), 20))
		}
	}
	if len(evs) == 0 || len(linesWith(strings.Join(evs, "\n"), `"url":"http://127.0.0.1:`+strconv.Itoa(closedPort)+`"`)) == 0 {
		t.Errorf("no fetch error event naming the unreachable instance's URL among %d events", len(evs))
	}
}
