package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/kubewatch"
)

// Labels and annotations read from discovered MAT Services.
const (
	// DefaultSelector selects the MAT API Services (the old controller's default).
	DefaultSelector = "nvidia-infra-controller/mat-service=true"
	// PodNameLabel carries the MAT pod name in multi-pod deployments.
	PodNameLabel = "nvidia-infra-controller/pod-name"
	// URLAnnotation, when set on a discovered Service, overrides the
	// computed API URL (e.g. "https://mat-0.example:1266").
	URLAnnotation = "matbus.io/mat-url"
	// OwnerSuffix is cut from the Service name to get the MAT Deployment name.
	OwnerSuffix = "-bmc-mock"
	// DefaultClusterDomain is the cluster's DNS domain unless
	// KubeConfig.ClusterDomain says otherwise (`--cluster-domain`).
	DefaultClusterDomain = "cluster.local"
	// HostModeDNS makes discovered API URLs name the Service's DNS name,
	// https://<service>.<namespace>.svc.<cluster-domain>:<port> (the
	// default, as the old controller).
	HostModeDNS = "dns"
	// HostModeClusterIP makes them name its spec.clusterIP.
	HostModeClusterIP = "cluster-ip"
)

// ServiceDNSName returns the in-cluster DNS name of a Service,
// "<name>.<namespace>.svc.<clusterDomain>" (clusterDomain "" means
// DefaultClusterDomain), e.g. "mat-0-bmc-mock.mat-system.svc.cluster.local":
// the name the old controller connects to and the one certificates issued in
// clusters (cert-manager) carry.
func ServiceDNSName(name, namespace, clusterDomain string) string {
	if clusterDomain == "" {
		clusterDomain = DefaultClusterDomain
	}
	return name + "." + namespace + ".svc." + clusterDomain
}

// KubeConfig configures a KubeSource.
type KubeConfig struct {
	// Namespace to watch ("" = all namespaces).
	Namespace string
	// Selector is a label selector; default DefaultSelector.
	Selector string
	// Scheme of the MAT API URL; default "https" (MAT serves HTTPS).
	Scheme string
	// HostMode is HostModeDNS (default: the Service's full DNS name, see
	// ServiceDNSName, the name the old controller connects to and
	// certificates issued in clusters carry) or HostModeClusterIP (its
	// spec.clusterIP; verifies only against a certificate with that IP).
	HostMode string
	// ClusterDomain is the cluster's DNS domain used in DNS names (see
	// ServiceDNSName); "" means DefaultClusterDomain.
	ClusterDomain string
	// Report receives the start and the end of each failure of the
	// informer's list or watch calls (kind events.ErrorWatch; see
	// KubeSource.WatchHealth); nil logs them only.
	Report *events.Reporter
}

// KubeSource discovers MAT instances as Kubernetes Services matching a label
// selector, through a client-go informer. The API URL is
// <scheme>://<host>:<port>, host per KubeConfig.HostMode (by default
// <service>.<namespace>.svc.<cluster-domain>), with the port named
// "redfish" or "bmc-mock", else the first port; URLAnnotation overrides it.
type KubeSource struct {
	kube     kubernetes.Interface
	cfg      KubeConfig
	selector labels.Selector
	log      *slog.Logger
	lister   corelisters.ServiceLister
	synced   cache.InformerSynced
	report   func(key, msg string)
	watch    *kubewatch.Tracker
}

// NewKube returns a Kubernetes source. It returns an error for an invalid
// selector, scheme or host mode. report (may be nil) receives Services that
// cannot be turned into an instance.
func NewKube(kube kubernetes.Interface, cfg KubeConfig, log *slog.Logger, report func(key, msg string)) (*KubeSource, error) {
	if cfg.Selector == "" {
		cfg.Selector = DefaultSelector
	}
	if cfg.Scheme == "" {
		cfg.Scheme = "https"
	}
	if cfg.Scheme != "http" && cfg.Scheme != "https" {
		return nil, fmt.Errorf("discovery: scheme %q: want http or https", cfg.Scheme)
	}
	if cfg.HostMode == "" {
		cfg.HostMode = HostModeDNS
	}
	if cfg.HostMode != HostModeClusterIP && cfg.HostMode != HostModeDNS {
		return nil, fmt.Errorf("discovery: host mode %q: want %s or %s", cfg.HostMode, HostModeDNS, HostModeClusterIP)
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("discovery: selector %q: %w", cfg.Selector, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if report == nil {
		report = func(string, string) {}
	}
	return &KubeSource{kube: kube, cfg: cfg, selector: sel, log: log, report: report,
		watch: kubewatch.New("services", cfg.Report, log)}, nil
}

// WatchHealth returns the tracker of the informer's list and watch calls:
// its Err is nil while they succeed, else the reason (e.g. "watch
// services: services is forbidden: …"). While it fails the instances are
// as of the last successful list (Instances still reports them), so
// changes reach them late or not at all.
func (s *KubeSource) WatchHealth() *kubewatch.Tracker { return s.watch }

// Scope implements Source: "k8s:<namespace>:<selector>".
func (s *KubeSource) Scope() string {
	ns := s.cfg.Namespace
	if ns == "" {
		ns = "*"
	}
	return "k8s:" + ns + ":" + s.selector.String()
}

// Run implements Source. The informer runs until ctx ends; deletes seen as
// tombstones (cache.DeletedFinalStateUnknown) are handled like deletes.
func (s *KubeSource) Run(ctx context.Context, notify func()) error {
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = s.selector.String() }
	opts := []informers.SharedInformerOption{informers.WithTweakListOptions(tweak)}
	if s.cfg.Namespace != "" {
		opts = append(opts, informers.WithNamespace(s.cfg.Namespace))
	}
	f := informers.NewSharedInformerFactoryWithOptions(s.kube, 0, opts...)
	if _, err := s.watch.ServiceInformer(f, s.cfg.Namespace, tweak); err != nil {
		return fmt.Errorf("discovery: informer: %w", err)
	}
	inf := f.Core().V1().Services()
	_, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				s.log.Debug("MAT Service deleted (tombstone)", "key", t.Key)
			}
			notify()
		},
	})
	if err != nil {
		return fmt.Errorf("discovery: informer handler: %w", err)
	}
	s.lister = inf.Lister()
	s.synced = inf.Informer().HasSynced
	f.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		f.Shutdown()
	}()
	return nil
}

// Instances implements Source.
func (s *KubeSource) Instances() ([]events.Instance, bool) {
	svcs, ok := s.selected()
	if !ok {
		return nil, false
	}
	out := make([]events.Instance, 0, len(svcs))
	for _, svc := range svcs {
		inst, err := s.instance(svc)
		if err != nil {
			s.report(svc.Namespace+"."+svc.Name, err.Error())
			continue
		}
		out = append(out, inst)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, true
}

// selected returns the Services the selector picks in the configured
// namespace (all namespaces when ""), from the informer cache; false until
// the informer has synced or when the cache cannot be listed.
func (s *KubeSource) selected() ([]*corev1.Service, bool) {
	if s.lister == nil || !s.synced() {
		return nil, false
	}
	var svcs []*corev1.Service
	var err error
	if s.cfg.Namespace != "" {
		svcs, err = s.lister.Services(s.cfg.Namespace).List(s.selector)
	} else {
		svcs, err = s.lister.List(s.selector)
	}
	return svcs, err == nil
}

// apiPort is the port of the MAT API on svc: the one named "redfish" or
// "bmc-mock", else the first. svc has at least one port.
func apiPort(svc *corev1.Service) int32 {
	for _, p := range svc.Spec.Ports {
		if p.Name == "redfish" || p.Name == "bmc-mock" {
			return p.Port
		}
	}
	return svc.Spec.Ports[0].Port
}

// InstanceFromService is the rule that turns a discovered Service into an
// instance; exported for tests and tools.
func (s *KubeSource) instance(svc *corev1.Service) (events.Instance, error) {
	key, err := events.Key(svc.Namespace, svc.Name)
	if err != nil {
		return events.Instance{}, err
	}
	inst := events.Instance{Key: key, Scope: s.Scope(), Version: svc.ResourceVersion,
		PodName: svc.Labels[PodNameLabel]}
	if strings.HasSuffix(svc.Name, OwnerSuffix) && len(svc.Name) > len(OwnerSuffix) {
		inst.Owner = strings.TrimSuffix(svc.Name, OwnerSuffix)
	}
	if u := svc.Annotations[URLAnnotation]; u != "" {
		if err := events.ValidateURL(u); err != nil {
			return events.Instance{}, fmt.Errorf("service %s/%s annotation %s: %w", svc.Namespace, svc.Name, URLAnnotation, err)
		}
		inst.URL = u
		return inst, nil
	}
	if len(svc.Spec.Ports) == 0 {
		return events.Instance{}, fmt.Errorf("service %s/%s has no ports", svc.Namespace, svc.Name)
	}
	port := apiPort(svc)
	host := ServiceDNSName(svc.Name, svc.Namespace, s.cfg.ClusterDomain)
	if s.cfg.HostMode == HostModeClusterIP {
		host = svc.Spec.ClusterIP
		if host == "" || host == corev1.ClusterIPNone {
			return events.Instance{}, fmt.Errorf("service %s/%s has no cluster IP (use host mode %s)", svc.Namespace, svc.Name, HostModeDNS)
		}
	}
	inst.URL = s.cfg.Scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(port)))
	return inst, nil
}
