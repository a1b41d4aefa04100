package kubeconn

import (
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
)

// Warnings reports the warnings the API server attaches to its answers
// (the Warning header, e.g. `spec.externalIPs is deprecated and may no
// longer be implemented in some clusters`): each distinct warning of a verb
// and resource is logged once per process at WARN, and every one is counted
// in matbus_kube_warnings_total{verb,resource}. Seen lists what was seen.
// It is safe for concurrent use; the zero value is not usable (NewWarnings).
type Warnings struct {
	log   *slog.Logger
	count *prometheus.CounterVec
	mu    sync.Mutex
	seen  map[warningKey]struct{}
}

type warningKey struct{ verb, resource, text string }

// NewWarnings returns a Warnings that logs to log (nil: discard).
func NewWarnings(log *slog.Logger) *Warnings {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Warnings{log: log, seen: map[warningKey]struct{}{},
		count: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "matbus", Name: "kube_warnings_total",
			Help: "Warnings the Kubernetes API server attached to its answers (e.g. a deprecated field), by verb and resource of the request; each distinct warning is logged once per process."},
			[]string{"verb", "resource"})}
}

// Collector is matbus_kube_warnings_total, for a process's registry.
func (w *Warnings) Collector() prometheus.Collector { return w.count }

// Install has every client made from cfg (and from copies of it) report
// its warnings to w instead of client-go's default of printing them to
// stderr.
func (w *Warnings) Install(cfg *rest.Config) {
	cfg.WarningHandler = rest.NoWarnings{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return warningTransport{rt: rt, w: w}
	})
}

// Seen returns the distinct warnings seen so far for verb ("create",
// "update", "list", ...) and resource ("services",
// "leases.coordination.k8s.io"), sorted.
func (w *Warnings) Seen(verb, resource string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k := range w.seen {
		if k.verb == verb && k.resource == resource {
			out = append(out, k.text)
		}
	}
	slices.Sort(out)
	return out
}

func (w *Warnings) observe(r *http.Request, values []string) {
	warnings, _ := utilnet.ParseWarningHeaders(values) // malformed ones are left out, as client-go does
	if len(warnings) == 0 {
		return
	}
	verb, resource := RequestVerb(r), RequestResource(r.URL.Path)
	for _, h := range warnings {
		w.count.WithLabelValues(verb, resource).Inc()
		k := warningKey{verb, resource, h.Text}
		w.mu.Lock()
		_, known := w.seen[k]
		w.seen[k] = struct{}{}
		w.mu.Unlock()
		if !known {
			w.log.Warn("Kubernetes API warning (logged once per process)", "verb", verb, "resource", resource, "warning", h.Text)
		}
	}
}

type warningTransport struct {
	rt http.RoundTripper
	w  *Warnings
}

func (t warningTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(r)
	if resp != nil {
		if v := resp.Header.Values("Warning"); len(v) > 0 {
			t.w.observe(r, v)
		}
	}
	return resp, err
}

// RequestVerb is the Kubernetes verb of r: get, list or watch for a GET
// (of a named object, a collection, or with watch=true), create, update,
// patch, delete or deletecollection for the others; the method in lower
// case for a path outside the resource APIs.
func RequestVerb(r *http.Request) string {
	obj := pathObject(r.URL.Path)
	if len(obj) == 0 {
		return strings.ToLower(r.Method) // not a resource path: /version, /readyz
	}
	named := len(obj) > 1
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		switch {
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			return "watch"
		case named:
			return "get"
		default:
			return "list"
		}
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		if named {
			return "delete"
		}
		return "deletecollection"
	}
	return strings.ToLower(r.Method)
}

// RequestResource is the resource of a Kubernetes API path as RBAC names
// it: "services" for /api/v1/namespaces/ns/services/x,
// "leases.coordination.k8s.io" for /apis/coordination.k8s.io/v1/...,
// with the subresource after a slash ("services/status"). Paths outside
// the resource APIs (/version, /readyz) are returned as they are.
func RequestResource(path string) string {
	group := ""
	if rest, ok := strings.CutPrefix(path, "/apis/"); ok {
		if g, _, ok := strings.Cut(rest, "/"); ok {
			group = g
		}
	} else if !strings.HasPrefix(path, "/api/") {
		return path
	}
	obj := pathObject(path)
	if len(obj) == 0 {
		return path
	}
	res := obj[0]
	if group != "" {
		res += "." + group
	}
	if len(obj) > 2 {
		res += "/" + obj[2]
	}
	return res
}

// pathObject returns the resource, name and subresource segments of a
// Kubernetes API path (as many as there are), after the group, version
// and namespace.
func pathObject(path string) []string {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:] // api, v1
	case len(segs) >= 3 && segs[0] == "apis":
		segs = segs[3:] // apis, group, version
	default:
		return nil
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:] // namespaces/<ns>/<resource>...
	}
	return segs
}
