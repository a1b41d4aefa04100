package deploytest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const tokenPath = "/var/run/secrets/kubernetes.io/serviceaccount"

// gatewayArgs turn the gateway on with an existing TLS Secret.
var gatewayArgs = []string{"--set", "gateway.enabled=true", "--set", "gateway.image=registry.example.com/mat-gateway:1.0.0",
	"--set", "gateway.tls.existingSecret=gw-tls"}

// podContainers returns the Deployment's containers by name, in order.
func podContainers(t *testing.T, dep *unstructured.Unstructured) ([]string, map[string]map[string]any) {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	var names []string
	by := map[string]map[string]any{}
	for _, c := range cs {
		m := c.(map[string]any)
		n := fmt.Sprint(m["name"])
		names = append(names, n)
		by[n] = m
	}
	return names, by
}

// mountsAt returns the names of the volumes mounted at path in c.
func mountsAt(c map[string]any, path string) []string {
	var out []string
	ms, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	for _, m := range ms {
		if mm := m.(map[string]any); mm["mountPath"] == path {
			out = append(out, fmt.Sprint(mm["name"]))
		}
	}
	return out
}

// gatewayTOML returns the rendered gateway.toml.
func gatewayTOML(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	s, _, _ := unstructured.NestedString(find(t, objs, "ConfigMap", "-gateway").Object, "data", "gateway.toml")
	return s
}

// tomlSection returns the key = value lines of one [section] of a
// rendered gateway.toml, comments left out.
func tomlSection(toml, section string) []string {
	var out []string
	in := section == ""
	for _, l := range strings.Split(toml, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "["):
			in = l == "["+section+"]"
		case in && l != "" && !strings.HasPrefix(l, "#"):
			out = append(out, l)
		}
	}
	return out
}

// TestChartGateway: off by default (no second container, ConfigMap,
// Service or Certificate); on, the discovery pods run the gateway with the
// chart's security context, its gateway.toml names the sources API of
// the discovery container on loopback as plain HTTP (what discovery
// serves, so no ca_cert_path), its TLS Secret and auth Secret are mounted,
// and the Service targets its port on the discovery pods.
func TestChartGateway(t *testing.T) {
	off := render(t, "matbus")
	for _, o := range off {
		if strings.HasSuffix(o.GetName(), "-gateway") {
			t.Errorf("gateway off renders %s/%s", o.GetKind(), o.GetName())
		}
	}
	if names, _ := podContainers(t, find(t, off, "Deployment", "-discovery")); !slices.Equal(names, []string{"discovery"}) {
		t.Errorf("gateway off: discovery containers %v", names)
	}

	objs := render(t, "mat", append(slices.Clone(gatewayArgs), "--set", "gateway.existingAuthSecret=gw-auth")...)
	dep := find(t, objs, "Deployment", "-discovery")
	names, cs := podContainers(t, dep)
	if !slices.Equal(names, []string{"discovery", "gateway"}) {
		t.Fatalf("discovery containers %v, want discovery then gateway", names)
	}
	gw := cs["gateway"]
	if gw["image"] != "registry.example.com/mat-gateway:1.0.0" {
		t.Errorf("gateway image %v", gw["image"])
	}
	if gw["args"] != nil || gw["command"] != nil || gw["env"] != nil {
		t.Errorf("gateway command %v args %v env %v: want the image's own, no environment", gw["command"], gw["args"], gw["env"])
	}
	if p, _, _ := unstructured.NestedSlice(gw, "ports"); fmt.Sprint(p) != "[map[containerPort:8443 name:gateway protocol:TCP]]" {
		t.Errorf("gateway ports %v", p)
	}
	if sc, _, _ := unstructured.NestedMap(gw, "securityContext"); fmt.Sprint(sc) != fmt.Sprint(cs["discovery"]["securityContext"]) {
		t.Errorf("gateway securityContext %v, discovery's %v", sc, cs["discovery"]["securityContext"])
	}
	for path, vol := range map[string]string{"/etc/mat-gateway/config": "gateway-config", "/etc/mat-gateway/tls": "gateway-tls", "/etc/mat-gateway/auth": "gateway-auth"} {
		if got := mountsAt(gw, path); !slices.Equal(got, []string{vol}) {
			t.Errorf("gateway mounts at %s: %v, want %s", path, got, vol)
		}
	}
	for vol, want := range map[string]string{"gateway-config": "configMap:map[defaultMode:292 name:matbus-gateway]",
		"gateway-tls": "secret:map[defaultMode:288 secretName:gw-tls]", "gateway-auth": "secret:map[defaultMode:288 secretName:gw-auth]"} {
		if v := namedItem(t, dep, "volumes", vol); !strings.Contains(fmt.Sprint(v), want) {
			t.Errorf("volume %s: %v, want %s", vol, v, want)
		}
	}
	if a := dep.Object["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)["annotations"].(map[string]any); a["checksum/gateway-config"] == nil {
		t.Errorf("no checksum/gateway-config annotation: the pods would not roll on a config change: %v", a)
	}

	toml := gatewayTOML(t, objs)
	for section, want := range map[string][]string{
		"server":  {`listen_ip_address = "0.0.0.0"`, `port = 8443`},
		"tls":     {`cert_path = "/etc/mat-gateway/tls/tls.crt"`, `key_path = "/etc/mat-gateway/tls/tls.key"`},
		"sources": {`url = "http://127.0.0.1:8090/v1/sources"`},
		"auth":    {`secret_dir = "/etc/mat-gateway/auth"`},
	} {
		if got := tomlSection(toml, section); !slices.Equal(got, want) {
			t.Errorf("gateway.toml [%s]: %q, want %q\n%s", section, got, want, toml)
		}
	}
	// The URL is what the discovery container serves: --source-list-addr.
	if !slices.Contains(container(t, dep).args, "--source-list-addr=127.0.0.1:8090") {
		t.Errorf("discovery args %v lack --source-list-addr=127.0.0.1:8090", container(t, dep).args)
	}

	svc := find(t, objs, "Service", "-gateway")
	if ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports"); fmt.Sprint(ports) != "[map[name:gateway port:8443 protocol:TCP targetPort:gateway]]" {
		t.Errorf("gateway Service ports %v", ports)
	}
	if typ, _, _ := unstructured.NestedString(svc.Object, "spec", "type"); typ != "ClusterIP" {
		t.Errorf("gateway Service type %q", typ)
	}
	sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("gateway Service selector %v does not select the discovery pods %v", sel, podLabels)
		}
	}
	if sel["app.kubernetes.io/component"] != "discovery" {
		t.Errorf("gateway Service selector %v: want the discovery pods only", sel)
	}
	for _, o := range objs {
		if o.GetKind() == "Certificate" {
			t.Errorf("an existing TLS Secret renders Certificate %s", o.GetName())
		}
	}
}

// TestChartGatewayCertManager: with tls.certManager the chart makes a
// Certificate for the gateway Service's DNS names and the SPIFFE URI of
// the pods' ServiceAccount, into the Secret the pods mount.
func TestChartGatewayCertManager(t *testing.T) {
	objs := render(t, "lab", "-f", chartDir+"/ci/all-features-values.yaml")
	c := find(t, objs, "Certificate", "-gateway")
	spec := c.Object["spec"].(map[string]any)
	dns, _, _ := unstructured.NestedStringSlice(spec, "dnsNames")
	if want := []string{"matbus-gateway", "matbus-gateway.lab", "matbus-gateway.lab.svc", "matbus-gateway.lab.svc.cluster.local"}; !slices.Equal(dns, want) {
		t.Errorf("Certificate dnsNames %v, want %v", dns, want)
	}
	if uris, _, _ := unstructured.NestedStringSlice(spec, "uris"); !slices.Equal(uris, []string{"spiffe://cluster.local/ns/lab/sa/matbus"}) {
		t.Errorf("Certificate uris %v", uris)
	}
	if ref, _, _ := unstructured.NestedStringMap(spec, "issuerRef"); fmt.Sprint(ref) != "map[group:cert-manager.io kind:ClusterIssuer name:cluster-ca]" {
		t.Errorf("Certificate issuerRef %v", ref)
	}
	if v := namedItem(t, find(t, objs, "Deployment", "-discovery"), "volumes", "gateway-tls"); !strings.Contains(fmt.Sprint(v), "secretName:"+fmt.Sprint(spec["secretName"])) {
		t.Errorf("volume gateway-tls %v does not mount the Certificate's Secret %v", v, spec["secretName"])
	}
	// IPv6: the listen address as given; the sources API stays on IPv4 loopback.
	toml := gatewayTOML(t, objs)
	if got := tomlSection(toml, "server"); !slices.Contains(got, `listen_ip_address = "::"`) {
		t.Errorf("gateway.toml [server] %q, want listen_ip_address \"::\"", got)
	}
}

// TestChartGatewaySourcesURL: [sources] url follows
// discovery.sourceList.addr; an all-addresses listener is reached on
// loopback.
func TestChartGatewaySourcesURL(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:8090": "http://127.0.0.1:8090/v1/sources",
		":9000":          "http://127.0.0.1:9000/v1/sources",
		"0.0.0.0:9000":   "http://127.0.0.1:9000/v1/sources",
		"[::1]:9000":     "http://[::1]:9000/v1/sources",
		"[::]:9000":      "http://[::1]:9000/v1/sources",
		"localhost:9000": "http://localhost:9000/v1/sources",
	} {
		objs := render(t, "matbus", append(slices.Clone(gatewayArgs), "--set", "discovery.sourceList.addr="+addr, "--set", "gateway.listenIpAddress=::")...)
		if got := tomlSection(gatewayTOML(t, objs), "sources"); !slices.Equal(got, []string{fmt.Sprintf("url = %q", want)}) {
			t.Errorf("discovery.sourceList.addr %s: [sources] %q, want url = %q", addr, got, want)
		}
	}
}

// TestChartGatewayValueErrors: the gateway without an image, without a
// certificate, with two, or without the sources API fails the render,
// naming what to set.
func TestChartGatewayValueErrors(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"gateway.enabled=true", "gateway.tls.existingSecret=gw-tls"}, "gateway.image is required when gateway.enabled is true"},
		{[]string{"gateway.enabled=true", "gateway.image=gw:1"}, "set gateway.tls.existingSecret or gateway.tls.certManager.enabled"},
		{[]string{"gateway.enabled=true", "gateway.image=gw:1", "gateway.tls.existingSecret=gw-tls", "gateway.tls.certManager.enabled=true"}, "are exclusive"},
		{[]string{"gateway.enabled=true", "gateway.image=gw:1", "gateway.tls.certManager.enabled=true"}, "gateway.tls.certManager.issuerRef.name is required"},
		{[]string{"gateway.enabled=true", "gateway.image=gw:1", "gateway.tls.existingSecret=gw-tls", "discovery.sourceList.addr="}, "discovery.sourceList.addr must not be empty"},
	} {
		cmd := []string{"template", "matbus", chartDir}
		for _, s := range tc.set {
			cmd = append(cmd, "--set", s)
		}
		out, err := helmErr(t, cmd...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set %v: want a failure mentioning %q, got err=%v\n%s", tc.set, tc.want, err, out)
		}
	}
	// The image alone is not enough, but nothing else is needed.
	if out, err := helmErr(t, append([]string{"lint", "--strict", chartDir}, gatewayArgs...)...); err != nil {
		t.Errorf("helm lint with the gateway on: %v\n%s", err, out)
	}
}

// TestChartServiceAccountToken: the discovery pods get no automatic token
// (a gateway container beside discovery must hold no Kubernetes
// credentials); the discovery container alone mounts the ServiceAccount's
// token, the cluster CA and the namespace where client-go's in-cluster
// configuration reads them. The workers keep the automatic mount.
func TestChartServiceAccountToken(t *testing.T) {
	for name, args := range map[string][]string{"gateway off": nil, "gateway on": gatewayArgs} {
		objs := render(t, "matbus", args...)
		dep := find(t, objs, "Deployment", "-discovery")
		spec, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
		if spec["automountServiceAccountToken"] != false {
			t.Errorf("%s: discovery automountServiceAccountToken %v, want false", name, spec["automountServiceAccountToken"])
		}
		_, cs := podContainers(t, dep)
		for n, c := range cs {
			got := mountsAt(c, tokenPath)
			if want := map[string][]string{"discovery": {"kube-api-access"}}[n]; !slices.Equal(got, want) {
				t.Errorf("%s: container %s mounts %v at %s, want %v", name, n, got, tokenPath, want)
			}
		}
		vol := fmt.Sprint(namedItem(t, dep, "volumes", "kube-api-access"))
		for _, want := range []string{"serviceAccountToken:map[expirationSeconds:3607 path:token]", "name:kube-root-ca.crt", "key:ca.crt path:ca.crt",
			"fieldPath:metadata.namespace", "path:namespace"} {
			if !strings.Contains(vol, want) {
				t.Errorf("%s: kube-api-access volume lacks %s: %s", name, want, vol)
			}
		}
		worker := find(t, objs, "Deployment", "-worker")
		if v, found, _ := unstructured.NestedFieldNoCopy(worker.Object, "spec", "template", "spec", "automountServiceAccountToken"); found {
			t.Errorf("%s: worker automountServiceAccountToken %v, want the ServiceAccount's (unset)", name, v)
		}
	}
}
