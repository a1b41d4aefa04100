package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/redact"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// checkResult is the outcome of one pre-flight check.
type checkResult string

const (
	checkOK   checkResult = "ok"
	checkWarn checkResult = "warn" // cannot tell, or not needed; not a failure
	checkFail checkResult = "FAIL" // this will not work
)

// checkRow is one line of the `matbus check` table.
type checkRow struct {
	name   string
	result checkResult
	detail string
}

// checker runs the pre-flight checks of one `matbus check` call.
type checker struct {
	n    natsOpts
	k    kubeOpts
	w    workerOpts
	d    discoveryOpts
	log  *slog.Logger
	kube kubernetes.Interface
	mode plan.IPMode
	rows []checkRow
}

func (c *checker) add(name string, r checkResult, format string, args ...any) {
	c.rows = append(c.rows, checkRow{name: name, result: r, detail: fmt.Sprintf(format, args...)})
}

func runCheck(ctx context.Context, args []string, e env) error {
	fs := newFlagSet("check", "Tell, before install, what will fail: NATS and JetStream, the Kubernetes API, RBAC, "+
		"the BMC and NVOS IPs of the MAT statuses against the service range for --bmc-ip-mode, whether the API server "+
		"admits spec.externalIPs, and --stream-replicas against the NATS cluster. Takes the flags and environment of `worker` and `discovery`; prints a table and exits 1 on a problem.", e.stderr)
	var c checker
	var l logOpts
	var timeout time.Duration
	c.n.register(fs)
	c.n.registerTLS(fs)
	c.n.registerReplicas(fs)
	l.register(fs)
	c.k.register(fs)
	c.w.register(fs)
	c.d.register(fs)
	durationVar(fs, &timeout, "timeout", 30*time.Second, "how long all checks together may take")
	var healthAddr string // the worker's and discovery's, so their flags and env apply unchanged
	fs.StringVar(&healthAddr, "health-addr", "", "accepted as in worker and discovery; check serves no endpoint")
	if err := parseAndValidate(fs, args, e.lookupEnv, c.n.validate, c.k.validate, c.w.validate, c.d.validate); err != nil {
		return err
	}
	log, err := l.logger(e.stderr)
	if err != nil {
		return err
	}
	c.log = log.With("component", "check")
	if err := c.w.loadMatRoots(); err != nil {
		return err
	}
	c.mode, _ = plan.ParseIPMode(c.w.ipMode)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	c.checkNATS(ctx)
	if c.checkKube(ctx) {
		c.checkRBAC(ctx)
	}
	cidrs := c.serviceRange(ctx)
	ips := c.statusIPs(ctx)
	c.checkRanges(ips, cidrs)
	if c.kube != nil {
		c.checkExternalIPs(ctx, ips)
	}
	if failed := writeCheckTable(e.stdout, c.rows); failed > 0 {
		fmt.Fprintf(e.stdout, "\n%d problem(s): matbus will not work as configured.\n", failed)
		return exitCode(1)
	}
	fmt.Fprintln(e.stdout, "\nno problem found.")
	return nil
}

// writeCheckTable prints rows and returns how many failed.
func writeCheckTable(w io.Writer, rows []checkRow) int {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	failed := 0
	for _, r := range rows {
		if r.result == checkFail {
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.name, r.result, r.detail)
	}
	_ = tw.Flush()
	return failed
}

// checkNATS connects once (no retry) and asks for the JetStream account.
func (c *checker) checkNATS(ctx context.Context) {
	url := redact.StripUserInfo(c.n.url)
	opts := []nats.Option{nats.Name("matbus-check"), nats.Timeout(5 * time.Second), nats.NoReconnect()}
	if c.n.creds != "" {
		opts = append(opts, nats.UserCredentials(c.n.creds))
	}
	tlsOpts, err := c.n.tlsOptions()
	if err != nil {
		c.add("NATS", checkFail, "%s: %v", url, err)
		return
	}
	nc, err := nats.Connect(c.n.url, append(opts, tlsOpts...)...)
	if err != nil {
		c.add("NATS", checkFail, "%s: %v", url, err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err == nil {
		var info *jetstream.AccountInfo
		if info, err = js.AccountInfo(ctx); err == nil {
			c.add("NATS", checkOK, "%s, JetStream enabled (%d streams)", url, info.Streams)
			c.checkReplicas(nc)
			return
		}
	}
	c.add("NATS", checkFail, "%s reachable, but no JetStream: %v", url, err)
}

// checkReplicas compares --stream-replicas with the NATS deployment the
// connection reached: more than one replica needs a JetStream cluster (a
// server without a cluster name refuses such streams), and a cluster needs
// at least that many servers (the client knows the servers the cluster
// advertises; fewer of them is a warning, since a server may not advertise
// itself to clients).
func (c *checker) checkReplicas(nc *nats.Conn) {
	want := c.n.replicas
	if want <= 1 {
		return
	}
	cluster := nc.ConnectedClusterName()
	if cluster == "" {
		c.add("stream replicas", checkFail, "--stream-replicas %d needs a JetStream cluster of at least %d servers; %s is a single server (no cluster name)",
			want, want, redact.StripUserInfo(nc.ConnectedUrlRedacted()))
		return
	}
	known := len(nc.Servers())
	if known < want {
		c.add("stream replicas", checkWarn, "--stream-replicas %d, but the client knows %d server(s) of cluster %q; NATS refuses streams with more replicas than JetStream servers",
			want, known, cluster)
		return
	}
	c.add("stream replicas", checkOK, "%d replicas; cluster %q, %d servers known", want, cluster, known)
}

// checkKube builds the client and asks for the server version.
func (c *checker) checkKube(ctx context.Context) bool {
	cfg, err := c.k.restConfig()
	if err == nil {
		c.kube, err = kubeClient(cfg)
	}
	if err != nil {
		c.add("Kubernetes API", checkFail, "%v", err)
		return false
	}
	v, err := c.kube.Discovery().ServerVersion()
	if err != nil {
		c.add("Kubernetes API", checkFail, "%s: %v", cfg.Host, err)
		c.kube = nil
		return false
	}
	c.add("Kubernetes API", checkOK, "%s, %s", cfg.Host, v.GitVersion)
	return true
}

// rbacNeed is one API call matbus makes.
type rbacNeed struct {
	who, group, resource, verb, namespace, name string
	optional                                    string // why it may be missing; "" when required
}

// checkRBAC asks the API server (SelfSubjectAccessReview) whether the
// current identity may make each call matbus makes.
func (c *checker) checkRBAC(ctx context.Context) {
	ns := c.w.namespace
	var needs []rbacNeed
	for _, v := range []string{"get", "list", "watch", "create", "update", "delete"} {
		needs = append(needs, rbacNeed{who: "worker", resource: "services", verb: v, namespace: ns})
	}
	needs = append(needs, rbacNeed{who: "worker", group: "apps", resource: "deployments", verb: "get", namespace: ns})
	if !c.d.isStatic() {
		needs = append(needs, rbacNeed{who: "discovery", resource: "services", verb: "list", namespace: ns},
			rbacNeed{who: "discovery", resource: "services", verb: "watch", namespace: ns})
	}
	if c.d.leaderElect {
		lns := c.d.leaseNamespace
		if lns == "" {
			lns = ns
		}
		needs = append(needs, rbacNeed{who: "discovery", group: "coordination.k8s.io", resource: "leases", verb: "create", namespace: lns})
		for _, v := range []string{"get", "update"} {
			needs = append(needs, rbacNeed{who: "discovery", group: "coordination.k8s.io", resource: "leases", verb: v, namespace: lns, name: c.d.leaseName})
		}
	}
	if len(c.w.serviceCIDRs) == 0 {
		needs = append(needs, rbacNeed{who: "worker", group: "networking.k8s.io", resource: "servicecidrs", verb: "list",
			optional: "without it and without --service-cidr, an IP refused as out of range is retried instead of reported at once"})
	}
	byWho := map[string][]string{}
	var optional []string
	for _, nd := range needs {
		r, err := c.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{
			Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authv1.ResourceAttributes{
				Namespace: nd.namespace, Verb: nd.verb, Group: nd.group, Resource: nd.resource, Name: nd.name}}}, metav1.CreateOptions{})
		what := nd.verb + " " + nd.resource
		if nd.group != "" {
			what += "." + nd.group
		}
		if nd.name != "" {
			what += "/" + nd.name
		}
		switch {
		case err != nil:
			c.add("RBAC", checkWarn, "cannot review %s: %v", what, err)
		case r.Status.Allowed:
		case nd.optional != "":
			optional = append(optional, what+" ("+nd.optional+")")
		default:
			byWho[nd.who] = append(byWho[nd.who], what)
		}
	}
	for _, who := range []string{"worker", "discovery"} {
		if denied := byWho[who]; len(denied) > 0 {
			c.add("RBAC "+who, checkFail, "denied in namespace %s: %s", ns, strings.Join(denied, ", "))
		} else {
			c.add("RBAC "+who, checkOK, "every call allowed")
		}
	}
	for _, o := range optional {
		c.add("RBAC (optional)", checkWarn, "denied: %s", o)
	}
}

// serviceRange returns --service-cidr, else the API's ServiceCIDRs; nil
// when unknown.
func (c *checker) serviceRange(ctx context.Context) []netip.Prefix {
	if cidrs, _ := worker.ParseCIDRs(c.w.serviceCIDRs); len(cidrs) > 0 {
		c.add("service range", checkOK, "%s (--service-cidr)", prefixes(cidrs))
		return cidrs
	}
	if c.kube == nil {
		c.add("service range", checkWarn, "unknown: no Kubernetes API and no --service-cidr")
		return nil
	}
	list, err := c.kube.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	if err != nil {
		c.add("service range", checkWarn, "unknown (set --service-cidr): ServiceCIDRs: %v", err)
		return nil
	}
	var out []netip.Prefix
	for _, sc := range list.Items {
		for _, s := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	if len(out) == 0 {
		c.add("service range", checkWarn, "unknown (set --service-cidr): no ServiceCIDR objects")
		return nil
	}
	c.add("service range", checkOK, "%s (ServiceCIDR objects)", prefixes(out))
	return out
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// serviceIP is an IP a Service would get, and whose.
type serviceIP struct {
	ip      netip.Addr
	service string // instance key / Service name
}

// statusIPs finds the MAT instances as discovery would and fetches each
// status once, returning the BMC and NVOS IPs of the Services plan.Build
// gives them.
func (c *checker) statusIPs(ctx context.Context) []serviceIP {
	insts, err := c.instances(ctx)
	if err != nil {
		c.add("MAT instances", checkFail, "%v", err)
		return nil
	}
	if len(insts) == 0 {
		c.add("MAT instances", checkWarn, "none found (no IP to check)")
		return nil
	}
	c.add("MAT instances", checkOK, "%d found", len(insts))
	mcfg := c.w.matConfig("matbus-check/" + version)
	sel, _ := parseSelector(c.w.targetSelector)
	opts := plan.Options{Namespace: c.w.namespace, ManagedBy: c.w.managedBy, IPMode: c.mode, TargetSelector: sel, StateAnnotations: c.w.stateAnnotations}
	var out []serviceIP
	for _, in := range insts {
		name := "MAT status " + in.Key
		mc, err := matclient.New(in.URL, mcfg)
		if err != nil {
			c.add(name, checkFail, "%s: %v", in.URL, err)
			continue
		}
		st, err := mc.Status(ctx)
		_ = mc.Close()
		if err != nil {
			c.add(name, checkFail, "%s: %v%s", in.URL, err, fetchHint(err, c.d.clusterDomain))
			continue
		}
		d := plan.Build(plan.Instance{Key: in.Key, PodName: in.PodName}, st, opts)
		bmc, nvos := 0, 0
		for _, s := range d.Services {
			ip, err := netip.ParseAddr(plan.ServiceIP(s))
			if err != nil {
				continue
			}
			if s.Annotations[plan.AnnotationNVOSIP] != "" {
				nvos++
			} else {
				bmc++
			}
			out = append(out, serviceIP{ip: ip, service: in.Key + "/" + s.Name})
		}
		held := 0
		for _, h := range d.Held {
			if h.Reason != plan.HoldNoBMCIP {
				held++
			}
		}
		r := checkOK
		if held > 0 {
			r = checkWarn
		}
		c.add(name, r, "%s: %d BMC and %d NVOS Services; %d devices held back (duplicate IP, name or invalid)", in.URL, bmc, nvos, held)
	}
	return out
}

// instances returns the instances discovery would publish now.
func (c *checker) instances(ctx context.Context) ([]events.Instance, error) {
	var src discovery.Source
	if c.d.isStatic() {
		s, err := c.d.source(nil, c.w.namespace, c.log, nil)
		if err != nil {
			return nil, err
		}
		src = s
	} else {
		if c.kube == nil {
			return nil, errors.New("discovery from Kubernetes Services needs the Kubernetes API (or use --static)")
		}
		k, err := discovery.NewKube(c.kube, discovery.KubeConfig{Namespace: c.w.namespace, Selector: c.d.selector,
			Scheme: c.d.scheme, HostMode: c.d.hostMode, ClusterDomain: c.d.clusterDomain}, c.log, func(key, msg string) {
			// A MAT Service discovery cannot use: discovery reports it at
			// every pass and publishes nothing for it.
			c.log.Warn("discovery", "instance", key, "error", msg)
			c.add("MAT Service "+key, checkFail, "not usable as a MAT instance: %s", msg)
		})
		if err != nil {
			return nil, err
		}
		src = k
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := src.Run(sctx, func() {}); err != nil {
		return nil, err
	}
	for {
		if insts, ok := src.Instances(); ok {
			return insts, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("source %s did not sync: %w", src.Scope(), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// checkRanges: in external-ip mode every IP must lie outside the service
// range (else the API server may allocate it as a clusterIP); in
// cluster-ip mode inside (else the create is refused).
func (c *checker) checkRanges(ips []serviceIP, cidrs []netip.Prefix) {
	name := "IPs vs service range (" + string(c.mode) + ")"
	if len(ips) == 0 {
		return
	}
	if len(cidrs) == 0 {
		c.add(name, checkWarn, "%d IPs not checked: service range unknown", len(ips))
		return
	}
	in := func(a netip.Addr) bool {
		for _, p := range cidrs {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	var bad []string
	for _, s := range ips {
		if in(s.ip) == (c.mode == plan.IPModeExternalIP) {
			bad = append(bad, s.ip.String()+" ("+s.service+")")
		}
	}
	sort.Strings(bad)
	if len(bad) == 0 {
		where := "inside"
		if c.mode == plan.IPModeExternalIP {
			where = "outside"
		}
		c.add(name, checkOK, "all %d IPs %s %s", len(ips), where, prefixes(cidrs))
		return
	}
	ex := bad
	if len(ex) > 3 {
		ex = append(ex[:3:3], "…")
	}
	if c.mode == plan.IPModeExternalIP {
		c.add(name, checkFail, "%d of %d IPs inside the service range (the API server may hand them out as cluster IPs): %s",
			len(bad), len(ips), strings.Join(ex, ", "))
		return
	}
	c.add(name, checkFail, "%d of %d IPs outside the service range (creates are refused; use --bmc-ip-mode=external-ip): %s",
		len(bad), len(ips), strings.Join(ex, ", "))
}

// checkExternalIPs asks for a server-side dry-run create of a Service with
// spec.externalIPs: refused by admission (e.g. the DenyServiceExternalIPs
// plugin) while RBAC allows the create, external-ip mode cannot work.
func (c *checker) checkExternalIPs(ctx context.Context, ips []serviceIP) {
	const name = "externalIPs admitted"
	ip := "192.0.2.10" // TEST-NET-1
	if len(ips) > 0 {
		ip = ips[0].ip.String()
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "matbus-check-", Namespace: c.w.namespace},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ExternalIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: plan.PortRedfish, Protocol: corev1.ProtocolTCP, Port: 443}}},
	}
	_, err := c.kube.CoreV1().Services(c.w.namespace).Create(ctx, svc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	needed := c.mode == plan.IPModeExternalIP
	fail := checkWarn
	if needed {
		fail = checkFail
	}
	switch {
	case err == nil:
		c.add(name, checkOK, "a dry-run create with spec.externalIPs [%s] was accepted", ip)
	case c.createAllowed(ctx):
		hint := ""
		if !needed {
			hint = " (not needed in cluster-ip mode)"
		}
		c.add(name, fail, "a dry-run create with spec.externalIPs [%s] was refused, e.g. by the DenyServiceExternalIPs admission plugin%s: %v", ip, hint, err)
	default:
		c.add(name, checkWarn, "cannot tell: Services may not be created (see RBAC): %v", err)
	}
}

func (c *checker) createAllowed(ctx context.Context) bool {
	r, err := c.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{
		Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authv1.ResourceAttributes{
			Namespace: c.w.namespace, Verb: "create", Resource: "services"}}}, metav1.CreateOptions{})
	return err == nil && r.Status.Allowed
}

// fetchHint is what check adds to a failed status fetch so that the row
// says what to change: for a refused certificate the flags of trust, for a
// cluster DNS name that does not resolve where check runs (outside the
// cluster) where it resolves. It is "" for other errors.
func fetchHint(err error, clusterDomain string) string {
	if matclient.IsVerificationError(err) {
		return " (trust the CA that issued it with --mat-ca-file; for MAT serving a self-signed certificate, --insecure-skip-verify)"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && clusterDomain != "" && strings.HasSuffix(strings.TrimSuffix(dnsErr.Name, "."), ".svc."+clusterDomain) {
		return " (a cluster DNS name resolves inside the cluster only: run check in a pod there, or use --mat-host-mode cluster-ip where cluster IPs are routed)"
	}
	return ""
}
