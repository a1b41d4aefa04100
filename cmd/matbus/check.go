package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/internal/cliflag"
	"github.com/matbus/matbus/internal/kubeconn"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/operator"
	"github.com/matbus/matbus/worker"
)

func runCheck(ctx context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("check", "Tell, before install, what will fail: NATS and JetStream, the Kubernetes API, the namespace, RBAC, "+
		"the BMC and NVOS IPs of the MAT statuses against the service range for --bmc-ip-mode, whether the API server "+
		"admits spec.externalIPs, and --stream-replicas against the NATS cluster. Takes the flags and environment of `worker` and `discovery`; prints a table and exits 1 on a problem.")
	var (
		o       toolOpts
		timeout time.Duration
	)
	o.register(fs)
	cliflag.DurationVar(fs, &timeout, "timeout", 30*time.Second, "how long all checks together may take")
	var healthAddr string // the worker's and discovery's, so their flags and env apply unchanged
	fs.StringVar(&healthAddr, "health-addr", "", "accepted as in worker and discovery; check serves no endpoint")
	log, err := o.parse(fs, args, e, "check")
	if err != nil {
		return err
	}
	n, k, w, d := &o.n, &o.k, &o.w, &o.d
	cidrs, _ := worker.ParseCIDRs(w.serviceCIDRs)
	mcfg := w.matConfig("matbus-check/" + version)
	cfg := operator.CheckConfig{
		NATSURL: n.URL,
		ConnectNATS: func() (*nats.Conn, error) {
			opts := []nats.Option{nats.Name("matbus-check"), nats.Timeout(5 * time.Second), nats.NoReconnect()}
			fileOpts, err := n.Config.FileOptions(log)
			if err != nil {
				return nil, err
			}
			return nats.Connect(n.URL, append(opts, fileOpts...)...)
		},
		Replicas:     n.replicas,
		Options:      w.planOptions(),
		ServiceCIDRs: cidrs,
		Discovery: discovery.KubeConfig{Selector: d.selector, Scheme: d.scheme, HostMode: d.hostMode,
			ClusterDomain: d.clusterDomain},
		LeaderElect:    d.leaderElect,
		LeaseNamespace: d.leaseNamespace,
		LeaseName:      d.leaseName,
		KubeEvents:     w.kubeEvents, // --kube-events, registered by the worker's flags
		NewClient:      func(url string) (operator.StatusClient, error) { return matclient.New(url, mcfg) },
		Log:            log,
	}
	// The API server's warnings on check's own dry-run create are a row
	// of the report, not a log line above it.
	k.Warnings = kubeconn.NewWarnings(nil)
	rc, err := k.restConfig(ctx, log)
	cfg.KubeWarnings = k.Warnings.Seen
	if err != nil {
		cfg.KubeErr = err
	} else {
		cfg.KubeHost = rc.Host
		cfg.Kube, cfg.KubeErr = kubeconn.Client(rc)
	}
	if d.isStatic() {
		if cfg.Static, err = d.source(nil, w.namespace, log, nil); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if failed := operator.WriteCheckTable(e.stdout, operator.Check(ctx, cfg)); failed > 0 {
		fmt.Fprintf(e.stdout, "\n%d problem(s): matbus will not work as configured.\n", failed)
		return exitCode(1)
	}
	fmt.Fprintln(e.stdout, "\nno problem found.")
	return nil
}
