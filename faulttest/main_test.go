package faulttest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/matbus/matbus/kubelocal"
)

// The package shares one kube-apiserver + etcd (tests run one after the
// other: the API outage test stops it) and one build of `matbus` and
// `nats-server`. Every test has its own nats-server process, namespace and
// matbus processes.

var (
	trialsFlag = flag.Int("trials", 0, "kill -9 trials of TestKillWorkerMidFanOut (default $FAULT_TRIALS or 5)")
	raceFlag   = flag.Bool("race-procs", os.Getenv("FAULT_RACE") != "", "build the matbus binary with -race (slower; $FAULT_RACE)")

	matbusBin string // the built binary
	natsBin   string // nats-server
	setupErr  error  // why the package's tests skip (or fail with MATBUS_REQUIRE_K8S)

	cluster   *kubelocal.Cluster
	adminKube kubernetes.Interface
	adminRest *rest.Config
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if testing.Short() && os.Getenv("MATBUS_REQUIRE_K8S") == "" {
			setupErr = fmt.Errorf("fault tests skipped in -short mode")
			return m.Run()
		}
		tmp, err := os.MkdirTemp("", "matbus-faulttest-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		setupErr = setup(tmp)
		if setupErr != nil && os.Getenv("MATBUS_REQUIRE_K8S") != "" {
			fmt.Fprintf(os.Stderr, "faulttest: MATBUS_REQUIRE_K8S is set but setup failed: %v\n", setupErr)
			return 1
		}
		defer func() {
			if cluster != nil {
				cluster.Stop()
			}
		}()
		return m.Run()
	}()
	os.Exit(code)
}

// setup builds matbus (and nats-server when .bin has none) into tmp and
// starts the API server.
func setup(tmp string) error {
	binDir, err := kubelocal.FindBinaries()
	if err != nil {
		return err
	}
	start := time.Now()
	args := []string{"build", "-o", filepath.Join(tmp, "matbus")}
	if *raceFlag {
		args = append(args, "-race")
	}
	args = append(args, "github.com/matbus/matbus/cmd/matbus")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("build matbus: %v\n%s", err, out)
	}
	matbusBin = filepath.Join(tmp, "matbus")
	natsBin = filepath.Join(binDir, "nats-server")
	if _, err := os.Stat(natsBin); err != nil {
		natsBin = filepath.Join(tmp, "nats-server")
		if out, err := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
			return fmt.Errorf("build nats-server: %v\n%s", err, out)
		}
	}
	fmt.Fprintf(os.Stderr, "faulttest: binaries ready in %v (race=%v)\n", time.Since(start).Round(time.Millisecond), *raceFlag)

	start = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err = kubelocal.Start(ctx, kubelocal.Config{BinDir: binDir})
	if err != nil {
		return err
	}
	adminRest = cluster.RESTConfig()
	adminRest.QPS, adminRest.Burst = 500, 1000
	adminKube, err = kubernetes.NewForConfig(adminRest)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "faulttest: kube-apiserver ready in %v at %s\n", time.Since(start).Round(time.Millisecond), cluster.URL)
	return nil
}

// requireSetup skips (or, with MATBUS_REQUIRE_K8S, fails) a test when the
// package could not set up.
func requireSetup(t *testing.T) {
	t.Helper()
	if setupErr != nil {
		t.Skipf("fault test skipped: %v (set MATBUS_REQUIRE_K8S=1 to make this a failure)", setupErr)
	}
}

// trials is how many kill -9 trials to run.
func trials() int {
	if *trialsFlag > 0 {
		return *trialsFlag
	}
	if n, err := strconv.Atoi(os.Getenv("FAULT_TRIALS")); err == nil && n > 0 {
		return n
	}
	return 5
}

// longRun reports whether the slow variants run ($FAULT_LONG, set by
// `make faulttest-long`).
func longRun() bool { return os.Getenv("FAULT_LONG") != "" }
