package kubelocal

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ErrNoBinaries is returned by FindBinaries when kube-apiserver or etcd is
// not in any searched folder.
var ErrNoBinaries = errors.New("kubelocal: kube-apiserver and etcd binaries not found (run `make tools`)")

// Config says where the binaries are and how to start the control plane.
type Config struct {
	// BinDir holds `etcd` and `kube-apiserver`; "" means FindBinaries.
	BinDir string
	// Dir holds the data, certificates and logs; "" means a new temporary
	// folder that Stop removes.
	Dir string
	// ServiceCIDR is the API server's service-cluster-ip-range; default
	// "10.96.0.0/12", wide enough for the BMC IPs of the MAT fixtures.
	ServiceCIDR string
	// Log receives progress lines; nil discards them.
	Log *slog.Logger
	// Output receives the processes' stdout/stderr; nil means Dir/*.log files.
	Output io.Writer
	// ReadyTimeout bounds the wait for /readyz; default 120 s (a first
	// start on a busy 2-core machine can take over a minute).
	ReadyTimeout time.Duration
	// EtcdPort and APIPort fix the ports; 0 picks free ones.
	EtcdPort, APIPort int
	// APIServerArgs are extra kube-apiserver flags, appended after the
	// built-in ones (a later flag wins), e.g.
	// []string{"--enable-admission-plugins=DenyServiceExternalIPs"}.
	APIServerArgs []string
	// Audit turns on the API server's audit log: every request at level
	// Metadata (who, verb, resource, user agent, code; no bodies), stages
	// ResponseStarted (watches) and ResponseComplete, one JSON line per
	// event in Dir/audit.log (Cluster.AuditLog), written before the
	// response completes (blocking mode, no batching, no rotation).
	Audit bool
}

// auditPolicy logs every request at level Metadata, without the
// RequestReceived stage (a request is then one line, a watch two: when it
// starts and when it ends).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// Cluster is a running etcd + kube-apiserver pair.
type Cluster struct {
	// URL of the API server, e.g. "https://127.0.0.1:41234".
	URL string
	// Token authenticates as user "admin" in group system:masters.
	Token string
	// Kubeconfig is the path of a kubeconfig file for kubectl and clients.
	Kubeconfig string
	// ServiceCIDR is the service IP range the API server allocates from.
	ServiceCIDR string
	// Dir is the state folder.
	Dir string
	// AuditLog is the path of the audit log (JSON lines, see Config.Audit),
	// "" when auditing is off.
	AuditLog string

	cfg      Config
	tempDir  bool
	etcd     *exec.Cmd
	api      *exec.Cmd
	etcdURL  string
	logFiles []*os.File
}

// FindBinaries returns the first folder holding both `etcd` and
// `kube-apiserver`, looking in $KUBEBUILDER_ASSETS, $MATBUS_BIN_DIR and then
// `.bin` in the working directory and its parents (the repository root).
func FindBinaries() (string, error) {
	var dirs []string
	for _, env := range []string{"KUBEBUILDER_ASSETS", "MATBUS_BIN_DIR"} {
		if v := os.Getenv(env); v != "" {
			dirs = append(dirs, v)
		}
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			dirs = append(dirs, filepath.Join(d, ".bin"))
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, d := range dirs {
		if isExec(filepath.Join(d, "etcd")) && isExec(filepath.Join(d, "kube-apiserver")) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// Start launches etcd and kube-apiserver and waits until /readyz answers
// 200. On error everything started is stopped again. The caller must call
// Stop.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.BinDir == "" {
		d, err := FindBinaries()
		if err != nil {
			return nil, err
		}
		cfg.BinDir = d
	}
	if cfg.ServiceCIDR == "" {
		cfg.ServiceCIDR = "10.96.0.0/12"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 120 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{cfg: cfg, ServiceCIDR: cfg.ServiceCIDR, Dir: cfg.Dir}
	if c.Dir == "" {
		d, err := os.MkdirTemp("", "matbus-kube-")
		if err != nil {
			return nil, fmt.Errorf("kubelocal: %w", err)
		}
		c.Dir, c.tempDir = d, true
	}
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	cfg := c.cfg
	for _, sub := range []string{"etcd", "certs"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, sub), 0o700); err != nil {
			return fmt.Errorf("kubelocal: %w", err)
		}
	}
	etcdPort, err := portOr(cfg.EtcdPort)
	if err != nil {
		return err
	}
	peerPort, err := portOr(0)
	if err != nil {
		return err
	}
	apiPort, err := portOr(cfg.APIPort)
	if err != nil {
		return err
	}
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	c.etcd = c.command("etcd", filepath.Join(cfg.BinDir, "etcd"),
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", c.etcdURL, "--advertise-client-urls", c.etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(peerPort),
		// 8 GiB instead of 2: runs that create and delete tens of
		// thousands of Services grow the database between compactions.
		"--quota-backend-bytes", strconv.Itoa(8<<30),
		"--unsafe-no-fsync", "--log-level", "warn")
	if err := c.etcd.Start(); err != nil {
		return fmt.Errorf("kubelocal: start etcd: %w", err)
	}
	cfg.Log.Info("etcd started", "url", c.etcdURL, "pid", c.etcd.Process.Pid)

	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return fmt.Errorf("kubelocal: token: %w", err)
	}
	c.Token = hex.EncodeToString(tok)
	tokenFile := filepath.Join(c.Dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(c.Token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return fmt.Errorf("kubelocal: %w", err)
	}
	saKey := filepath.Join(c.Dir, "certs", "sa.key")
	saPub := filepath.Join(c.Dir, "certs", "sa.pub")
	if err := writeSAKeys(saKey, saPub); err != nil {
		return err
	}
	var auditArgs []string
	if cfg.Audit {
		policy := filepath.Join(c.Dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
			return fmt.Errorf("kubelocal: %w", err)
		}
		c.AuditLog = filepath.Join(c.Dir, "audit.log")
		auditArgs = []string{"--audit-policy-file=" + policy, "--audit-log-path=" + c.AuditLog,
			"--audit-log-format=json", "--audit-log-mode=blocking", "--audit-log-maxsize=0"}
	}
	c.URL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	args := append([]string{
		"--etcd-servers=" + c.etcdURL,
		"--cert-dir=" + filepath.Join(c.Dir, "certs"),
		"--secure-port=" + strconv.Itoa(apiPort), "--bind-address=127.0.0.1",
		"--service-cluster-ip-range=" + cfg.ServiceCIDR,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://localhost",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false"}, auditArgs...)
	c.api = c.command("kube-apiserver", filepath.Join(cfg.BinDir, "kube-apiserver"), append(args, cfg.APIServerArgs...)...)
	if err := c.api.Start(); err != nil {
		return fmt.Errorf("kubelocal: start kube-apiserver: %w", err)
	}
	cfg.Log.Info("kube-apiserver started", "url", c.URL, "pid", c.api.Process.Pid)
	if err := c.waitReady(ctx); err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig); err != nil {
		return err
	}
	return nil
}

func (c *Cluster) command(name, path string, args ...string) *exec.Cmd {
	cmd := exec.Command(path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if c.cfg.Output != nil {
		cmd.Stdout, cmd.Stderr = c.cfg.Output, c.cfg.Output
	} else if f, err := os.Create(filepath.Join(c.Dir, name+".log")); err == nil {
		cmd.Stdout, cmd.Stderr = f, f
		c.logFiles = append(c.logFiles, f)
	}
	return cmd
}

func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer hc.CloseIdleConnections()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+c.Token)
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if c.api.ProcessState != nil {
			return fmt.Errorf("kubelocal: kube-apiserver exited early (see %s)", filepath.Join(c.Dir, "kube-apiserver.log"))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubelocal: kube-apiserver not ready at %s (last: %s; logs in %s): %w", c.URL, last, c.Dir, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// RESTConfig returns a client configuration authenticated as the admin user.
// The API server's certificate is self-signed and not verified.
func (c *Cluster) RESTConfig() *rest.Config {
	return &rest.Config{Host: c.URL, BearerToken: c.Token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

func (c *Cluster) writeKubeconfig(path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["matbus-local"] = &clientcmdapi.Cluster{Server: c.URL, InsecureSkipTLSVerify: true}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.Token}
	kc.Contexts["matbus-local"] = &clientcmdapi.Context{Cluster: "matbus-local", AuthInfo: "admin", Namespace: "default"}
	kc.CurrentContext = "matbus-local"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("kubelocal: write kubeconfig: %w", err)
	}
	return nil
}

// StopAPIServer stops only kube-apiserver (etcd keeps the data), for
// outage tests; StartAPIServer starts it again on the same port.
func (c *Cluster) StopAPIServer() error {
	return stopProc(c.api)
}

// StartAPIServer restarts a kube-apiserver stopped by StopAPIServer and waits for /readyz.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	args := c.api.Args
	c.api = c.command("kube-apiserver", args[0], args[1:]...)
	if err := c.api.Start(); err != nil {
		return fmt.Errorf("kubelocal: restart kube-apiserver: %w", err)
	}
	return c.waitReady(ctx)
}

// Stop stops kube-apiserver and etcd (SIGTERM, then SIGKILL after 5 s) and
// removes a temporary Dir. It is safe to call more than once.
func (c *Cluster) Stop() {
	_ = stopProc(c.api)
	_ = stopProc(c.etcd)
	for _, f := range c.logFiles {
		f.Close()
	}
	c.logFiles = nil
	if c.tempDir && c.Dir != "" {
		os.RemoveAll(c.Dir)
		c.Dir = ""
	}
}

func stopProc(cmd *exec.Cmd) error {
	if cmd == nil || cmd.Process == nil || cmd.ProcessState != nil {
		return nil
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		return <-done
	}
}

func portOr(p int) (int, error) {
	if p != 0 {
		return p, nil
	}
	return FreePort()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("kubelocal: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func writeSAKeys(keyPath, pubPath string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("kubelocal: service account key: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("kubelocal: service account key: %w", err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return fmt.Errorf("kubelocal: %w", err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("kubelocal: %w", err)
	}
	return nil
}
