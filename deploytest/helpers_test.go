package deploytest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/matbus/matbus/kubelocal"
)

// Shared state of the package: the repository root, a matbus binary built
// once, the help of each subcommand, and one local API server.
var (
	root string

	buildOnce sync.Once
	buildDir  string
	matbusBin string
	buildErr  error

	natsOnce sync.Once
	natsBin  string
	natsErr  error

	helpMu    sync.Mutex
	helpCache = map[string]map[string][]string{}

	clusterOnce sync.Once
	cluster     *kubelocal.Cluster
	clusterErr  error
)

func TestMain(m *testing.M) {
	var err error
	root, err = repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploytest:", err)
		os.Exit(1)
	}
	code := m.Run()
	if cluster != nil {
		cluster.Stop()
	}
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// repoRoot is the folder of the project's go.mod above the working directory.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/matbus/matbus\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("repository root (go.mod of github.com/matbus/matbus) not found")
		}
	}
}

func requireAll() bool { return os.Getenv("MATBUS_REQUIRE_K8S") != "" }

// skipOrFail skips the test, or fails it when MATBUS_REQUIRE_K8S is set (CI).
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if requireAll() {
		t.Fatalf("%s (MATBUS_REQUIRE_K8S is set: run `make tools`)", msg)
	}
	t.Skipf("%s (set MATBUS_REQUIRE_K8S=1 to make this a failure; `make tools` builds it)", msg)
}

// tool returns the path of a tool built into .bin/ by `make tools`.
func tool(t *testing.T, name string) string {
	t.Helper()
	dirs := []string{os.Getenv("MATBUS_BIN_DIR"), filepath.Join(root, ".bin")}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p
		}
	}
	skipOrFail(t, "%s not found in .bin/", name)
	return ""
}

// matbus returns a matbus binary built from this tree (once per package run).
func matbus(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "matbus-deploytest-")
		if buildErr != nil {
			return
		}
		matbusBin = filepath.Join(buildDir, "matbus")
		cmd := exec.Command("go", "build", "-o", matbusBin, "./cmd/matbus")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/matbus: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return matbusBin
}

// natsServer returns nats-server built from the version go.mod requires
// (the version docker-compose.yaml's image pins), once per package run.
func natsServer(t *testing.T) string {
	t.Helper()
	matbus(t) // makes buildDir
	natsOnce.Do(func() {
		natsBin = filepath.Join(buildDir, "nats-server")
		cmd := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			natsErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsErr != nil {
		t.Fatal(natsErr)
	}
	return natsBin
}

// helpLine is how `matbus <sub> --help` lists a flag: "  --name  [env NAME]",
// or "  --name  [env NAME or OLD_NAME]" for a flag with an old alias.
var helpLine = regexp.MustCompile(`^  --([a-z0-9-]+)  \[env ([A-Z0-9_]+(?: or [A-Z0-9_]+)*)\]$`)

// help returns the flags of `matbus <sub> --help`, each with its
// environment variables in the order they are read.
func help(t *testing.T, sub string) map[string][]string {
	t.Helper()
	helpMu.Lock()
	defer helpMu.Unlock()
	if h, ok := helpCache[sub]; ok {
		return h
	}
	cmd := exec.Command(matbus(t), sub, "--help")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("matbus %s --help: %v\n%s", sub, err, out.String())
	}
	flags := map[string][]string{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if m := helpLine.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = strings.Split(m[2], " or ")
		}
	}
	if len(flags) == 0 {
		t.Fatalf("matbus %s --help lists no flags:\n%s", sub, out.String())
	}
	helpCache[sub] = flags
	return flags
}

// envOf returns every environment variable of `matbus <sub> --help`
// (old aliases included), each with its flag.
func envOf(t *testing.T, sub string) map[string]string {
	out := map[string]string{}
	for f, names := range help(t, sub) {
		for _, e := range names {
			out[e] = f
		}
	}
	return out
}

// Variables matbus reads that are not a flag's: POD_NAME names the process
// (cmd/matbus/common.go: hostname()). Checked against the source below.
var nonFlagEnv = map[string]string{"POD_NAME": "cmd/matbus/common.go"}

// checkNonFlagEnv fails unless each non-flag variable is still read where
// nonFlagEnv says.
func checkNonFlagEnv(t *testing.T) {
	t.Helper()
	for name, file := range nonFlagEnv {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(`"`+name+`"`)) {
			t.Errorf("%s no longer reads %s; the deployment files must stop setting it", file, name)
		}
	}
}

// checkArgs reports every flag in args that `matbus <sub> --help` does not
// list, and then lets matbus itself parse args (followed by --help, so
// nothing starts): a value that does not parse, a stray positional word or
// a bool flag given a separate value all end in exit status 2. what names
// the source in messages.
func checkArgs(t *testing.T, what, sub string, args []string) {
	t.Helper()
	flags := help(t, sub)
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue // a value; the parse below tells a stray word
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, ok := flags[name]; !ok {
			t.Errorf("%s: flag --%s is not in `matbus %s --help`", what, name, sub)
		}
	}
	cmd := exec.Command(matbus(t), append(append([]string{sub}, args...), "--help")...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: `matbus %s %s` does not parse: %v\n%s", what, sub, strings.Join(args, " "), err, lastLines(out, 3))
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// checkEnv reports every variable that is neither a flag's variable of
// `matbus <sub> --help` nor one of nonFlagEnv.
func checkEnv(t *testing.T, what, sub string, names []string) {
	t.Helper()
	vars := envOf(t, sub)
	for _, n := range names {
		if _, ok := vars[n]; ok {
			continue
		}
		if _, ok := nonFlagEnv[n]; ok {
			continue
		}
		t.Errorf("%s: environment variable %s is not in `matbus %s --help`", what, n, sub)
	}
}

// helm runs .bin/helm with args in the repository root and returns stdout.
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(tool(t, "helm"), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}

// helmErr is helm for commands expected to fail: it returns the combined
// output and the error.
func helmErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(tool(t, "helm"), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

const chartDir = "deploy/helm/matbus"

// render runs `helm template` with release "matbus" in namespace ns and
// returns the objects.
func render(t *testing.T, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out := helm(t, append([]string{"template", "matbus", chartDir, "--namespace", ns}, args...)...)
	return decodeObjects(t, out)
}

func decodeObjects(t *testing.T, manifest []byte) []*unstructured.Unstructured {
	t.Helper()
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rendered chart: %v", err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("rendered chart is not YAML: %v\n%s", err, doc)
		}
		if string(bytes.TrimSpace(j)) == "null" {
			continue // an empty document (a template that rendered nothing)
		}
		// UnmarshalJSON keeps integers as int64, as the typed converters expect.
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(j); err != nil {
			t.Fatalf("rendered object: %v\n%s", err, doc)
		}
		objs = append(objs, o)
	}
	return objs
}

// find returns the rendered object of kind and name suffix, or fails.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, nameSuffix string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && strings.HasSuffix(o.GetName(), nameSuffix) {
			return o
		}
	}
	t.Fatalf("no %s named *%s in the rendered chart", kind, nameSuffix)
	return nil
}

// requireCluster returns the package's local API server, started on first use.
func requireCluster(t *testing.T) *kubelocal.Cluster {
	t.Helper()
	if _, err := kubelocal.FindBinaries(); err != nil {
		skipOrFail(t, "%v", err)
	}
	clusterOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, clusterErr = kubelocal.Start(ctx, kubelocal.Config{})
	})
	if clusterErr != nil {
		t.Fatalf("kubelocal: %v", clusterErr)
	}
	return cluster
}

func adminConfig(c *kubelocal.Cluster) *rest.Config {
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 100, 200
	cfg.WarningHandler = rest.NoWarnings{}
	return cfg
}

// newNamespace creates a namespace for this test and deletes it afterwards.
func newNamespace(t *testing.T, kube kubernetes.Interface, prefix string) string {
	t.Helper()
	ctx := context.Background()
	ns, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{}) })
	return ns.Name
}
