package operator

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
	"sync"
	"text/tabwriter"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/internal/redact"
	"github.com/matbus/matbus/matclient"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

// CheckResult is the outcome of one pre-flight check.
type CheckResult string

// The outcomes of a check row.
const (
	CheckOK   CheckResult = "ok"
	CheckWarn CheckResult = "warn" // cannot tell, or not needed; not a failure
	CheckFail CheckResult = "FAIL" // this will not work
)

// CheckRow is one line of the `matbus check` table.
type CheckRow struct {
	Name   string      `json:"name"`
	Result CheckResult `json:"result"`
	Detail string      `json:"detail"`
}

// CheckConfig is what Check needs: the settings of the worker and discovery
// it checks, and the clients it checks them with.
type CheckConfig struct {
	// NATSURL is --nats-url, shown in the NATS row without its user info.
	NATSURL string
	// ConnectNATS connects to NATS once, without retry (the caller's
	// credentials and TLS); Check closes the connection.
	ConnectNATS func() (*nats.Conn, error)
	// Replicas is --stream-replicas; above 1 it is compared with the
	// cluster the connection reached.
	Replicas int
	// Kube is the Kubernetes client, nil when none could be built; KubeErr
	// says why (a FAIL row). KubeHost names the API server in the rows.
	Kube     kubernetes.Interface
	KubeHost string
	KubeErr  error
	// Options are the worker's plan options; Options.Namespace is the
	// namespace whose RBAC and Services are checked.
	Options plan.Options
	// ServiceCIDRs is --service-cidr; empty means the API's ServiceCIDRs.
	ServiceCIDRs []netip.Prefix
	// Static is discovery's static source (--static, --static-file); nil
	// means discovery from Kubernetes Services with Discovery (its
	// Namespace is taken from Options).
	Static    discovery.Source
	Discovery discovery.KubeConfig
	// LeaderElect, LeaseNamespace ("" means Options.Namespace) and LeaseName
	// are discovery's leader-election settings, for the Lease RBAC rows.
	LeaderElect    bool
	LeaseNamespace string
	LeaseName      string
	// KubeEvents is true when the components record Kubernetes Events:
	// create and patch of events.k8s.io events are then required.
	KubeEvents bool
	// NewClient returns the status client of one instance URL, closed after
	// its one fetch.
	NewClient func(url string) (StatusClient, error)
	// Log receives discovery's warnings; nil discards them.
	Log *slog.Logger
	// KubeWarnings returns the distinct warnings the API server gave Kube's
	// requests of a verb and resource (kubeconn.Warnings.Seen); nil: not
	// known, and the externalIPs deprecation row is left out.
	KubeWarnings func(verb, resource string) []string
}

// checker runs the pre-flight checks of one Check call.
type checker struct {
	cfg  CheckConfig
	log  *slog.Logger
	kube kubernetes.Interface // nil unless the API server answered
	// nsMissing: the API server said the namespace does not exist.
	nsMissing bool

	mu   sync.Mutex // rows: discovery's callback adds from its own goroutine
	rows []CheckRow
}

func (c *checker) add(name string, r CheckResult, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// No detail shows the user info of a URL, parsable or not (an error may quote one).
	c.rows = append(c.rows, CheckRow{Name: name, Result: r, Detail: redact.StripUserInfo(fmt.Sprintf(format, args...))})
}

// Check runs the pre-flight checks in order: NATS and JetStream (and
// --stream-replicas against the cluster), the Kubernetes API, whether the
// namespace exists, the RBAC of
// every call the worker and discovery make (SelfSubjectAccessReview), the
// service range, one status fetch per discovered MAT instance, their BMC and
// NVOS IPs against the service range for the IP mode, and whether the API
// server admits spec.externalIPs (a server-side dry-run create). It
// returns one row per finding and writes nothing.
func Check(ctx context.Context, cfg CheckConfig) []CheckRow {
	c := checker{cfg: cfg, log: cfg.Log}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.checkNATS(ctx)
	if c.checkKube() {
		c.checkNamespace(ctx)
		c.checkRBAC(ctx)
	}
	cidrs := c.serviceRange(ctx)
	ips := c.statusIPs(ctx)
	c.checkRanges(ips, cidrs)
	if c.kube != nil {
		c.checkExternalIPs(ctx, ips)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rows
}

// WriteCheckTable prints rows as a table (CHECK, RESULT, DETAIL) and
// returns how many failed.
func WriteCheckTable(w io.Writer, rows []CheckRow) int {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	failed := 0
	for _, r := range rows {
		if r.Result == CheckFail {
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Name, r.Result, r.Detail)
	}
	_ = tw.Flush()
	return failed
}

// checkNATS connects once (no retry) and asks for the JetStream account.
func (c *checker) checkNATS(ctx context.Context) {
	url := redact.StripUserInfo(c.cfg.NATSURL)
	for _, u := range strings.Split(c.cfg.NATSURL, ",") {
		// nats.go's parse error would quote the URL and a bad escape of its password.
		if _, err := redact.ParseURL(strings.TrimSpace(u)); err != nil {
			c.add("NATS", CheckFail, "invalid URL %v", err)
			return
		}
	}
	nc, err := c.cfg.ConnectNATS()
	if err != nil {
		c.add("NATS", CheckFail, "%s: %v", url, err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err == nil {
		var info *jetstream.AccountInfo
		if info, err = js.AccountInfo(ctx); err == nil {
			c.add("NATS", CheckOK, "%s, JetStream enabled (%d streams)", url, info.Streams)
			c.checkReplicas(nc)
			return
		}
	}
	c.add("NATS", CheckFail, "%s reachable, but no JetStream: %v", url, err)
}

// checkReplicas compares --stream-replicas with the NATS deployment the
// connection reached: more than one replica needs a JetStream cluster (a
// server without a cluster name refuses such streams), and a cluster needs
// at least that many servers (the client knows the servers the cluster
// advertises; fewer of them is a warning, since a server may not advertise
// itself to clients).
func (c *checker) checkReplicas(nc *nats.Conn) {
	want := c.cfg.Replicas
	if want <= 1 {
		return
	}
	cluster := nc.ConnectedClusterName()
	if cluster == "" {
		c.add("stream replicas", CheckFail, "--stream-replicas %d needs a JetStream cluster of at least %d servers; %s is a single server (no cluster name)",
			want, want, redact.StripUserInfo(nc.ConnectedUrlRedacted()))
		return
	}
	known := len(nc.Servers())
	if known < want {
		c.add("stream replicas", CheckWarn, "--stream-replicas %d, but the client knows %d server(s) of cluster %q; NATS refuses streams with more replicas than JetStream servers",
			want, known, cluster)
		return
	}
	c.add("stream replicas", CheckOK, "%d replicas; cluster %q, %d servers known", want, cluster, known)
}

// checkKube asks the API server for its version.
func (c *checker) checkKube() bool {
	if c.cfg.KubeErr != nil || c.cfg.Kube == nil {
		err := c.cfg.KubeErr
		if err == nil {
			err = errors.New("no Kubernetes client")
		}
		c.add("Kubernetes API", CheckFail, "%v", err)
		return false
	}
	v, err := c.cfg.Kube.Discovery().ServerVersion()
	if err != nil {
		c.add("Kubernetes API", CheckFail, "%s: %v", c.cfg.KubeHost, err)
		return false
	}
	c.kube = c.cfg.Kube
	c.add("Kubernetes API", CheckOK, "%s, %s", c.cfg.KubeHost, v.GitVersion)
	return true
}

// checkNamespace asks for the namespace of the Services: a worker cannot
// create a Service in a namespace that does not exist (and does not create
// namespaces). An identity without get on namespaces cannot tell; that is
// no failure, since matbus itself never reads namespaces.
func (c *checker) checkNamespace(ctx context.Context) {
	const name = "namespace"
	ns := c.cfg.Options.Namespace
	_, err := c.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	switch {
	case err == nil:
		c.add(name, CheckOK, "%s exists", ns)
	case apierrors.IsNotFound(err):
		c.nsMissing = true
		c.add(name, CheckFail, "namespace %q does not exist, so every Service create fails: create it (kubectl create namespace %s) or set --namespace", ns, ns)
	case apierrors.IsForbidden(err):
		c.add(name, CheckWarn, "could not verify that %s exists: this identity may not get namespaces (matbus does not need to)", ns)
	default:
		c.add(name, CheckWarn, "could not verify that %s exists: %v", ns, err)
	}
}

// rbacNeed is one API call matbus makes.
type rbacNeed struct {
	who, group, resource, verb, namespace, name string
	optional                                    string // why it may be missing; "" when required
}

// checkRBAC asks the API server (SelfSubjectAccessReview) whether the
// current identity may make each call matbus makes.
func (c *checker) checkRBAC(ctx context.Context) {
	ns := c.cfg.Options.Namespace
	var needs []rbacNeed
	for _, v := range []string{"get", "list", "watch", "create", "update", "delete"} {
		needs = append(needs, rbacNeed{who: "worker", resource: "services", verb: v, namespace: ns})
	}
	needs = append(needs, rbacNeed{who: "worker", group: "apps", resource: "deployments", verb: "get", namespace: ns})
	if c.cfg.Static == nil {
		needs = append(needs, rbacNeed{who: "discovery", resource: "services", verb: "list", namespace: ns},
			rbacNeed{who: "discovery", resource: "services", verb: "watch", namespace: ns})
	}
	if c.cfg.LeaderElect {
		lns := c.cfg.LeaseNamespace
		if lns == "" {
			lns = ns
		}
		needs = append(needs, rbacNeed{who: "discovery", group: "coordination.k8s.io", resource: "leases", verb: "create", namespace: lns})
		for _, v := range []string{"get", "update"} {
			needs = append(needs, rbacNeed{who: "discovery", group: "coordination.k8s.io", resource: "leases", verb: v, namespace: lns, name: c.cfg.LeaseName})
		}
	}
	if c.cfg.KubeEvents {
		for _, v := range []string{"create", "patch"} {
			needs = append(needs, rbacNeed{who: "Kubernetes Events", group: "events.k8s.io", resource: "events", verb: v, namespace: ns})
		}
	}
	if len(c.cfg.ServiceCIDRs) == 0 {
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
			c.add("RBAC", CheckWarn, "cannot review %s: %v", what, err)
		case r.Status.Allowed:
		case nd.optional != "":
			optional = append(optional, what+" ("+nd.optional+")")
		default:
			byWho[nd.who] = append(byWho[nd.who], what)
		}
	}
	whos := []string{"worker", "discovery"}
	if c.cfg.KubeEvents {
		whos = append(whos, "Kubernetes Events")
	}
	for _, who := range whos {
		if denied := byWho[who]; len(denied) > 0 {
			c.add("RBAC "+who, CheckFail, "denied in namespace %s: %s", ns, strings.Join(denied, ", "))
		} else {
			c.add("RBAC "+who, CheckOK, "every call allowed")
		}
	}
	for _, o := range optional {
		c.add("RBAC (optional)", CheckWarn, "denied: %s", o)
	}
}

// serviceRange returns --service-cidr, else the API's ServiceCIDRs; nil
// when unknown.
func (c *checker) serviceRange(ctx context.Context) []netip.Prefix {
	if cidrs := c.cfg.ServiceCIDRs; len(cidrs) > 0 {
		c.add("service range", CheckOK, "%s (--service-cidr)", prefixes(cidrs))
		return cidrs
	}
	if c.kube == nil {
		c.add("service range", CheckWarn, "unknown: no Kubernetes API and no --service-cidr")
		return nil
	}
	out, err := worker.ServiceCIDRs(ctx, c.kube)
	if err != nil {
		c.add("service range", CheckWarn, "unknown (set --service-cidr): ServiceCIDRs: %v", err)
		return nil
	}
	if len(out) == 0 {
		c.add("service range", CheckWarn, "unknown (set --service-cidr): no ServiceCIDR objects")
		return nil
	}
	c.add("service range", CheckOK, "%s (ServiceCIDR objects)", prefixes(out))
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
		c.add("MAT instances", CheckFail, "%v", err)
		return nil
	}
	if len(insts) == 0 {
		c.add("MAT instances", CheckWarn, "none found (no IP to check)")
		return nil
	}
	c.add("MAT instances", CheckOK, "%d found", len(insts))
	opts := c.cfg.Options
	var out []serviceIP
	for _, in := range insts {
		name := "MAT status " + in.Key
		mc, err := c.cfg.NewClient(in.URL)
		if err != nil {
			c.add(name, CheckFail, "%s: %v", in.URL, err)
			continue
		}
		st, err := mc.Status(ctx)
		_ = mc.Close()
		if err != nil {
			c.add(name, CheckFail, "%s: %v%s", in.URL, err, fetchHint(err, c.cfg.Discovery.ClusterDomain))
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
		r := CheckOK
		if held > 0 {
			r = CheckWarn
		}
		c.add(name, r, "%s: %d BMC and %d NVOS Services; %d devices held back (duplicate IP, name or invalid)", in.URL, bmc, nvos, held)
	}
	return out
}

// instances returns the instances discovery would publish now.
func (c *checker) instances(ctx context.Context) ([]events.Instance, error) {
	src := c.cfg.Static
	if src == nil {
		if c.kube == nil {
			return nil, errors.New("discovery from Kubernetes Services needs the Kubernetes API (or use --static)")
		}
		kcfg := c.cfg.Discovery
		kcfg.Namespace = c.cfg.Options.Namespace
		k, err := discovery.NewKube(c.kube, kcfg, c.log, func(key, msg string) {
			// A MAT Service discovery cannot use: discovery reports it at
			// every pass and publishes nothing for it.
			c.log.Warn("discovery", "instance", key, "error", msg)
			c.add("MAT Service "+key, CheckFail, "not usable as a MAT instance: %s", msg)
		})
		if err != nil {
			return nil, fmt.Errorf("operator: %w", err)
		}
		src = k
	}
	insts, err := Instances(ctx, src)
	if errors.Is(err, ErrNoInstance) {
		return nil, nil
	}
	return insts, err
}

// checkRanges: in external-ip mode every IP must lie outside the service
// range (else the API server may allocate it as a clusterIP); in
// cluster-ip mode inside (else the create is refused).
func (c *checker) checkRanges(ips []serviceIP, cidrs []netip.Prefix) {
	mode := c.cfg.Options.IPMode
	name := "IPs vs service range (" + string(mode) + ")"
	if len(ips) == 0 {
		return
	}
	if len(cidrs) == 0 {
		c.add(name, CheckWarn, "%d IPs not checked: service range unknown", len(ips))
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
		if in(s.ip) == (mode == plan.IPModeExternalIP) {
			bad = append(bad, s.ip.String()+" ("+s.service+")")
		}
	}
	sort.Strings(bad)
	if len(bad) == 0 {
		where := "inside"
		if mode == plan.IPModeExternalIP {
			where = "outside"
		}
		c.add(name, CheckOK, "all %d IPs %s %s", len(ips), where, prefixes(cidrs))
		return
	}
	ex := bad
	if len(ex) > 3 {
		ex = append(ex[:3:3], "…")
	}
	if mode == plan.IPModeExternalIP {
		c.add(name, CheckFail, "%d of %d IPs inside the service range (the API server may hand them out as cluster IPs): %s",
			len(bad), len(ips), strings.Join(ex, ", "))
		return
	}
	var outside []netip.Addr
	for _, s := range ips {
		if !in(s.ip) {
			outside = append(outside, s.ip)
		}
	}
	c.add(name, CheckFail, "%d of %d IPs outside the service range (creates are refused): %s; create a ServiceCIDR (networking.k8s.io/v1, one per network) for each of %s (or larger, for growth; the chart's bmcServiceCIDR values do it), or use --bmc-ip-mode=external-ip",
		len(bad), len(ips), strings.Join(ex, ", "), prefixes(CoveringPrefixes(outside)))
}

// CoveringPrefixes returns, for addresses, the smallest prefixes that
// cover them network by network: the addresses are grouped by their /16
// (IPv4) or /48 (IPv6), and each group gets the longest prefix that holds
// its lowest and highest address. The result is sorted and holds each
// prefix once; each is a candidate spec.cidrs entry of a ServiceCIDR (one
// CIDR per family per object). No addresses give nil.
func CoveringPrefixes(addrs []netip.Addr) []netip.Prefix {
	type span struct{ lo, hi netip.Addr }
	groups := map[netip.Prefix]*span{}
	for _, a := range addrs {
		a = a.Unmap()
		bits := 16
		if a.Is6() {
			bits = 48
		}
		g, _ := a.Prefix(bits)
		sp := groups[g]
		if sp == nil {
			groups[g] = &span{a, a}
			continue
		}
		if a.Less(sp.lo) {
			sp.lo = a
		}
		if sp.hi.Less(a) {
			sp.hi = a
		}
	}
	var out []netip.Prefix
	for _, sp := range groups {
		bits := sp.lo.BitLen()
		for ; bits > 0; bits-- {
			if p, _ := sp.lo.Prefix(bits); p.Contains(sp.hi) {
				break
			}
		}
		p, _ := sp.lo.Prefix(bits)
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr().Less(out[j].Addr()) })
	return out
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
		ObjectMeta: metav1.ObjectMeta{GenerateName: "matbus-check-", Namespace: c.cfg.Options.Namespace},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ExternalIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: plan.PortRedfish, Protocol: corev1.ProtocolTCP, Port: 443}}},
	}
	_, err := c.kube.CoreV1().Services(c.cfg.Options.Namespace).Create(ctx, svc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	needed := c.cfg.Options.IPMode == plan.IPModeExternalIP
	fail := CheckWarn
	if needed {
		fail = CheckFail
	}
	switch {
	case err == nil:
		c.add(name, CheckOK, "a dry-run create with spec.externalIPs [%s] was accepted", ip)
		c.checkExternalIPsDeprecated(needed)
	case c.nsMissing || apierrors.IsNotFound(err):
		// A create is refused as not found only for a missing namespace.
		c.add(name, CheckWarn, "cannot tell: namespace %q does not exist (see the namespace row): %v", c.cfg.Options.Namespace, err)
	case c.createAllowed(ctx):
		hint := ""
		if !needed {
			hint = " (not needed in cluster-ip mode)"
		}
		c.add(name, fail, "a dry-run create with spec.externalIPs [%s] was refused, e.g. by the DenyServiceExternalIPs admission plugin%s: %v", ip, hint, err)
	default:
		c.add(name, CheckWarn, "cannot tell: Services may not be created (see RBAC): %v", err)
	}
}

// checkExternalIPsDeprecated reports whether the API server warned about
// spec.externalIPs on the dry-run create (Kubernetes 1.36 deprecated the
// field, KEP-5707): kube-proxy may stop implementing it, and every BMC
// Service of external-ip mode would then stop routing.
func (c *checker) checkExternalIPsDeprecated(needed bool) {
	const name = "externalIPs deprecation"
	if c.cfg.KubeWarnings == nil {
		return
	}
	var warned string
	for _, w := range c.cfg.KubeWarnings("create", "services") {
		if strings.Contains(w, "externalIPs") {
			warned = w
			break
		}
	}
	switch {
	case warned == "":
		c.add(name, CheckOK, "the API server gave no warning for spec.externalIPs")
	case needed:
		c.add(name, CheckWarn, "the API server warns %q: where kube-proxy stops implementing externalIPs, every BMC Service of external-ip mode stops routing (docs/configuration.md, --bmc-ip-mode)", warned)
	default:
		c.add(name, CheckOK, "the API server warns %q; cluster-ip mode does not use externalIPs", warned)
	}
}

func (c *checker) createAllowed(ctx context.Context) bool {
	r, err := c.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{
		Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authv1.ResourceAttributes{
			Namespace: c.cfg.Options.Namespace, Verb: "create", Resource: "services"}}}, metav1.CreateOptions{})
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
