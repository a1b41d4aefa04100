package kubetls_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/matbus/matbus/internal/kubetls"
	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/kubelocal"
)

// TestApplyLeavesInlineAndTokenConfigs: a configuration without TLS files
// (inline data, a token, insecure) is client-go's as before.
func TestApplyLeavesInlineAndTokenConfigs(t *testing.T) {
	ca := testenv.NewCA(t, "inline CA")
	for _, cfg := range []*rest.Config{
		{Host: "https://127.0.0.1:6443", BearerTokenFile: "/var/run/token", TLSClientConfig: rest.TLSClientConfig{CAData: ca.PEM}},
		{Host: "https://127.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{Insecure: true}},
		{Host: "https://127.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{CAFile: "/x/ca.crt"}, ExecProvider: &clientcmdapi.ExecConfig{Command: "x"}},
	} {
		files, err := kubetls.Apply(t.Context(), cfg, nil)
		if err != nil || files != (kubetls.Files{}) || cfg.Transport != nil {
			t.Errorf("%+v: Apply took %+v (err %v), want nothing", cfg, files, err)
		}
	}
	_, err := kubetls.Apply(t.Context(), &rest.Config{Host: "https://h", TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(t.TempDir(), "missing")}}, nil)
	if err == nil || !strings.Contains(err.Error(), "Kubernetes CA file") || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing CA file: %v", err)
	}
}

// TestKubeconfigFilesRotate runs a real kube-apiserver that serves a
// certificate of its own CA (--tls-cert-file) and authenticates clients by
// certificate (--client-ca-file), and a client built from a kubeconfig
// that names a CA file, a client certificate and a key in a kubelet-style
// volume. At an API server restart while the CA file is missing and the
// certificate half-written, the last good files are used (one warning
// each). Then the API server's certificate is re-issued by a new CA and it
// takes client certificates of another new CA only; the volume swaps to the
// new CA and a new client certificate: after the restart, the same client
// (no new configuration, no process restart) verifies the server with the
// new CA and is authenticated as the new certificate's user.
func TestKubeconfigFilesRotate(t *testing.T) {
	bin, err := kubelocal.FindBinaries()
	if errors.Is(err, kubelocal.ErrNoBinaries) && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
		t.Skip("kube-apiserver/etcd not built; run `make tools` (make test does)")
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	serverCA1, serverCA2 := testenv.NewCA(t, "API server CA 1"), testenv.NewCA(t, "API server CA 2")
	clientCA1, clientCA2 := testenv.NewCA(t, "client CA 1"), testenv.NewCA(t, "client CA 2")
	srvDir := t.TempDir()
	srvCert, srvKey, clientCAFile := filepath.Join(srvDir, "srv.crt"), filepath.Join(srvDir, "srv.key"), filepath.Join(srvDir, "client-ca.crt")
	serve := func(ca, clientCA *testenv.CA) {
		t.Helper()
		c, k := ca.KeyPairPEM(ca.IssueIP("127.0.0.1", "localhost"))
		for path, data := range map[string][]byte{srvCert: c, srvKey: k, clientCAFile: clientCA.PEM} {
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	serve(serverCA1, clientCA1)
	cl, err := kubelocal.Start(ctx, kubelocal.Config{BinDir: bin, APIServerArgs: []string{
		"--tls-cert-file=" + srvCert, "--tls-private-key-file=" + srvKey, "--client-ca-file=" + clientCAFile}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()

	c1, k1 := clientCA1.KeyPairPEM(clientCA1.IssueClient("rotator-1", "system:masters"))
	vol := testenv.NewVolume(t, map[string][]byte{"ca.crt": serverCA1.PEM, "tls.crt": c1, "tls.key": k1})
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cl.URL, CertificateAuthority: vol.Path("ca.crt")}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificate: vol.Path("tls.crt"), ClientKey: vol.Path("tls.key")}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	files, err := kubetls.Apply(ctx, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if files.CAFile != vol.Path("ca.crt") || files.CertFile != vol.Path("tls.crt") || files.KeyFile != vol.Path("tls.key") {
		t.Fatalf("Apply took %+v, want the kubeconfig's three files", files)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	whoami := func() (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		r, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			return "", err
		}
		return r.Status.UserInfo.Username, nil
	}
	if u, err := whoami(); err != nil || u != "rotator-1" {
		t.Fatalf("before any change: user %q, %v; want rotator-1", u, err)
	}
	restart := func() {
		t.Helper()
		if err := cl.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		if err := cl.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Bad files at a new connection: the last good ones are used.
	vol.Unlink("ca.crt")
	vol.WriteInPlace("tls.crt", c1[:len(c1)/2])
	restart()
	testenv.Wait(t, time.Minute, "a request with the last good files", func() (bool, string) {
		u, err := whoami()
		return err == nil && u == "rotator-1", u + " " + errString(err)
	})
	for _, name := range []string{"Kubernetes CA file", "Kubernetes client certificate"} {
		if n := strings.Count(logs.String(), "level=WARN msg=\"file not usable, keeping its last good contents (logged once until it changes)\" file=\""+name); n != 1 {
			t.Errorf("%s: %d warnings, want 1; log:\n%s", name, n, logs.String())
		}
	}
	if strings.Contains(logs.String(), "PRIVATE KEY") {
		t.Errorf("key contents in the log:\n%s", logs.String())
	}

	// Rotation.
	serve(serverCA2, clientCA2)
	c2, k2 := clientCA2.KeyPairPEM(clientCA2.IssueClient("rotator-2", "system:masters"))
	vol.Update(map[string][]byte{"ca.crt": serverCA2.PEM, "tls.crt": c2, "tls.key": k2})
	restart()
	testenv.Wait(t, time.Minute, "a request with the new files", func() (bool, string) {
		u, err := whoami()
		return err == nil && u == "rotator-2", u + " " + errString(err)
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
