package plan

import (
	"reflect"
	"slices"
	"testing"

	"github.com/matbus/matbus/matclient"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// v2MixedServices are the Service names Build gives v2-mixed.json: every
// device with a BMC IP (2 hosts, 3 DPUs, 2 switches, 1 power shelf), and
// the NVOS Service of the ND5200 switch (the N5700 has no NVOS IP).
var v2MixedServices = []string{
	"mat-bmc-dpu-2458e540-24e-879b716a",
	"mat-bmc-dpu-9b8d41e8-ad4-b3d5aa50",
	"mat-bmc-dpu-a15919aa-572-726d4120",
	"mat-bmc-host-1a530254-57f-964ececc",
	"mat-bmc-host-624423f1-04b-216d49b5",
	"mat-bmc-host-7ec7b7c3-126-c030b365",
	"mat-bmc-host-922f3d9b-20b-4da64654",
	"mat-bmc-host-d5bb3746-fdf-4f4ad08b",
	"mat-nvos-1a530254-57f-964ececc",
}

// v2MixedHeld: the Supermicro host without a BMC IP and its DPU (no IP
// either).
var v2MixedHeld = []Hold{
	{MatID: "923c3a06-0b09-4573-a4da-142c606ae61e", Name: "mat-bmc-dpu-923c3a06-0b0-51bc17a6", Reason: HoldNoBMCIP},
	{MatID: "d171a368-ea6a-45f5-9b66-6767052fe916", Name: "mat-bmc-host-d171a368-ea6-3f95c484", Reason: HoldNoBMCIP},
}

// TestBuildV2MixedService compares one whole Service (DGX GB300 host
// 7ec7b7c3…: IPMI, SSH, a DPU) field by field, in both modes, with and
// without a pod name, with state annotations and without.
func TestBuildV2MixedService(t *testing.T) {
	const name = "mat-bmc-host-7ec7b7c3-126-c030b365"
	base := func() *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{
				Name:      name,
				Namespace: "bmc",
				Labels: map[string]string{
					LabelManagedBy:   "mat-k8s-controller",
					LabelInstance:    "mat-ns.mat-bmc-mock",
					LabelMatID:       "7ec7b7c3-126b-412a-babf-fd79d002e921",
					LabelMachineID:   "fm100ht0idt7gv8tp1vb97bfpb2bu6gujcr88as2p19ucii8sgev7oe1jav",
					LabelMachineType: "host",
					LabelDeviceKind:  "host",
				},
				Annotations: map[string]string{
					AnnotationMatID:        "7ec7b7c3-126b-412a-babf-fd79d002e921",
					AnnotationBMCIP:        "10.96.64.13",
					AnnotationAPIState:     "HostInitializing/WaitingForDiscovery",
					AnnotationPowerState:   "On",
					AnnotationHardwareType: "nvidia_dgx_gb300",
					AnnotationRedfishPort:  "1266",
					AnnotationIPMIPort:     "16021",
					AnnotationSSHPort:      "2222",
				},
				OwnerReferences: []metav1.OwnerReference{testOwner},
			},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeClusterIP,
				Ports: []corev1.ServicePort{
					{Name: "redfish", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(1266)},
					{Name: "ipmi", Protocol: corev1.ProtocolUDP, Port: 16021, TargetPort: intstr.FromInt32(16021)},
					{Name: "ssh", Protocol: corev1.ProtocolTCP, Port: 2222, TargetPort: intstr.FromInt32(2222)},
				},
				Selector: map[string]string{"app": "machine-a-tron"},
			},
		}
	}
	tests := []struct {
		name      string
		mode      IPMode
		pod       string
		noStateAn bool
		want      func() *corev1.Service
	}{
		{"cluster-ip", IPModeClusterIP, "", false, func() *corev1.Service {
			s := base()
			s.Spec.ClusterIP = "10.96.64.13"
			s.Spec.ClusterIPs = []string{"10.96.64.13"}
			return s
		}},
		{"external-ip", IPModeExternalIP, "", false, func() *corev1.Service {
			s := base()
			s.Spec.ExternalIPs = []string{"10.96.64.13"}
			return s
		}},
		{"zero mode is cluster-ip", "", "", false, func() *corev1.Service {
			s := base()
			s.Spec.ClusterIP = "10.96.64.13"
			s.Spec.ClusterIPs = []string{"10.96.64.13"}
			return s
		}},
		{"multi-pod", IPModeExternalIP, "mat-0", false, func() *corev1.Service {
			s := base()
			s.Labels[LabelPodName] = "mat-0"
			s.Spec.Selector[PodNameLabel] = "mat-0"
			s.Spec.ExternalIPs = []string{"10.96.64.13"}
			return s
		}},
		{"state annotations off", IPModeClusterIP, "", true, func() *corev1.Service {
			s := base()
			delete(s.Annotations, AnnotationAPIState)
			delete(s.Annotations, AnnotationPowerState)
			s.Spec.ClusterIP = "10.96.64.13"
			s.Spec.ClusterIPs = []string{"10.96.64.13"}
			return s
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inst := testInstance()
			inst.PodName = tc.pod
			opts := testOptions(tc.mode)
			opts.StateAnnotations = !tc.noStateAn
			d := Build(inst, loadStatus(t, "v2-mixed.json"), opts)
			i := slices.IndexFunc(d.Services, func(s *corev1.Service) bool { return s.Name == name })
			if i < 0 {
				t.Fatalf("no %s in %v", name, names(d.Services))
			}
			if got, want := d.Services[i], tc.want(); !reflect.DeepEqual(got, want) {
				t.Errorf("Service differs\n got: %+v\nwant: %+v", got, want)
			}
		})
	}
}

// TestBuildV2Mixed checks every device of v2-mixed.json: one Service per
// device with a BMC IP, kinds, ports, IPs, DPU parents; the devices without
// an IP are held.
func TestBuildV2Mixed(t *testing.T) {
	type port struct {
		name  string
		proto corev1.Protocol
		port  int32
		to    int32
	}
	redfish := port{"redfish", corev1.ProtocolTCP, 443, 1266}
	ssh := func(p int32) port { return port{"ssh", corev1.ProtocolTCP, p, p} }
	want := map[string]struct {
		ip, typ, parent, hw string
		ports               []port
	}{
		"mat-bmc-host-922f3d9b-20b-4da64654": {"10.96.64.10", "host", "", "wiwynn_gb200_nvl", []port{redfish, ssh(2222)}},
		"mat-bmc-dpu-2458e540-24e-879b716a":  {"10.96.64.11", "dpu", "922f3d9b-20be-461f-9b69-90928701ce93", "", []port{redfish, ssh(34011)}},
		"mat-bmc-dpu-a15919aa-572-726d4120":  {"10.96.64.12", "dpu", "922f3d9b-20be-461f-9b69-90928701ce93", "", []port{redfish, ssh(34012)}},
		"mat-bmc-host-7ec7b7c3-126-c030b365": {"10.96.64.13", "host", "", "nvidia_dgx_gb300", []port{redfish, {"ipmi", corev1.ProtocolUDP, 16021, 16021}, ssh(2222)}},
		"mat-bmc-dpu-9b8d41e8-ad4-b3d5aa50":  {"10.96.64.14", "dpu", "7ec7b7c3-126b-412a-babf-fd79d002e921", "", []port{redfish, ssh(34014)}},
		"mat-bmc-host-1a530254-57f-964ececc": {"10.96.64.30", "switch", "", "nvidia_switch_nd5200_ld", []port{redfish}},
		"mat-bmc-host-d5bb3746-fdf-4f4ad08b": {"10.96.64.31", "switch", "", "nvidia_switch_n5700_ld", []port{redfish}},
		"mat-bmc-host-624423f1-04b-216d49b5": {"10.96.64.40", "power-shelf", "", "liteon_power_shelf", []port{redfish}},
	}
	for _, mode := range []IPMode{IPModeClusterIP, IPModeExternalIP} {
		t.Run(string(mode), func(t *testing.T) {
			d := Build(testInstance(), loadStatus(t, "v2-mixed.json"), testOptions(mode))
			if got := names(d.Services); !slices.Equal(got, v2MixedServices) {
				t.Fatalf("services %v, want %v", got, v2MixedServices)
			}
			if !reflect.DeepEqual(d.Held, v2MixedHeld) {
				t.Errorf("held %+v, want %+v", d.Held, v2MixedHeld)
			}
			if d.Instance != "mat-ns.mat-bmc-mock" || d.PodName != "" || d.NoStatus {
				t.Errorf("scope %q/%q/%v", d.Instance, d.PodName, d.NoStatus)
			}
			for _, s := range d.Services {
				checkValid(t, s)
				if s.Labels[LabelMachineType] == string(MachineTypeNVOS) {
					continue // TestBuildNVOS
				}
				w := want[s.Name]
				if s.Labels[LabelDeviceKind] != w.typ || s.Labels[LabelMachineType] != MachineType(w.typ).ContractType() ||
					s.Labels[LabelParentID] != w.parent ||
					s.Annotations[AnnotationBMCIP] != w.ip || s.Annotations[AnnotationHardwareType] != w.hw {
					t.Errorf("%s: labels %v annotations %v", s.Name, s.Labels, s.Annotations)
				}
				if _, ok := s.Labels[LabelParentID]; ok != (w.parent != "") {
					t.Errorf("%s: parent label present = %v", s.Name, ok)
				}
				if s.Labels[LabelMatID] != s.Annotations[AnnotationMatID] {
					t.Errorf("%s: mat-id label %q != annotation %q", s.Name, s.Labels[LabelMatID], s.Annotations[AnnotationMatID])
				}
				var ports []port
				for _, p := range s.Spec.Ports {
					ports = append(ports, port{p.Name, p.Protocol, p.Port, p.TargetPort.IntVal})
				}
				if !slices.Equal(ports, w.ports) {
					t.Errorf("%s: ports %v, want %v", s.Name, ports, w.ports)
				}
				switch mode {
				case IPModeClusterIP:
					if s.Spec.ClusterIP != w.ip || !slices.Equal(s.Spec.ClusterIPs, []string{w.ip}) || s.Spec.ExternalIPs != nil {
						t.Errorf("%s: clusterIP %q %v externalIPs %v", s.Name, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.ExternalIPs)
					}
				case IPModeExternalIP:
					if s.Spec.ClusterIP != "" || s.Spec.ClusterIPs != nil || !slices.Equal(s.Spec.ExternalIPs, []string{w.ip}) {
						t.Errorf("%s: clusterIP %q %v externalIPs %v", s.Name, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.ExternalIPs)
					}
				}
				if s.Spec.Type != corev1.ServiceTypeClusterIP || !reflect.DeepEqual(s.OwnerReferences, []metav1.OwnerReference{testOwner}) {
					t.Errorf("%s: type %q owners %v", s.Name, s.Spec.Type, s.OwnerReferences)
				}
			}
		})
	}
}

// TestBuildIPMIMapping: the Supermicro host's IPMI (623 -> 16022) becomes a
// UDP port once its BMC has an IP; its DPU, still without one, stays held.
func TestBuildIPMIMapping(t *testing.T) {
	st := loadStatus(t, "v2-mixed.json")
	device(t, st, "d171a368").BMC.IP = "10.96.64.60"
	d := Build(testInstance(), st, testOptions(IPModeClusterIP))
	i := slices.IndexFunc(d.Services, func(s *corev1.Service) bool { return s.Name == "mat-bmc-host-d171a368-ea6-3f95c484" })
	if i < 0 {
		t.Fatal("no Service for the Supermicro host")
	}
	s := d.Services[i]
	want := []corev1.ServicePort{
		{Name: "redfish", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(1266)},
		{Name: "ipmi", Protocol: corev1.ProtocolUDP, Port: 623, TargetPort: intstr.FromInt32(16022)},
	}
	if !reflect.DeepEqual(s.Spec.Ports, want) || s.Annotations[AnnotationIPMIPort] != "16022" {
		t.Errorf("ports %+v ipmi annotation %q", s.Spec.Ports, s.Annotations[AnnotationIPMIPort])
	}
	if _, ok := s.Annotations[AnnotationSSHPort]; ok {
		t.Error("ssh annotation without SSH")
	}
	if _, ok := s.Labels[LabelMachineID]; ok {
		t.Error("machine-id label without machine_id")
	}
	if len(d.Held) != 1 || d.Held[0].Name != "mat-bmc-dpu-923c3a06-0b0-51bc17a6" {
		t.Errorf("held %+v", d.Held)
	}
}

func hostWithIP(id, ip string) matclient.Device {
	return matclient.Device{
		MatID: id, Kind: matclient.KindMachine, APIState: "Ready", PowerState: "On",
		BMC: matclient.BMC{IP: ip, Redfish: matclient.Endpoint{ReachablePort: 443, ListenPort: 1266}},
	}
}

// TestBuildHolds covers who gets no Service, and that the outcome does not
// depend on the order of the body.
func TestBuildHolds(t *testing.T) {
	dupIP := func(t *testing.T, reversed bool) *matclient.Status {
		st := loadStatus(t, "malformed/duplicate-bmc-ip.json")
		if reversed {
			slices.Reverse(st.Machines)
		}
		return st
	}
	// Two distinct ids whose (kept, old controller's) names collide: the
	// same first 12 bytes, and FNV-1a-32 of both is 0adeb684.
	collide := func(reversed bool) *matclient.Status {
		st := &matclient.Status{Schema: matclient.SchemaV2, Machines: []matclient.Device{
			hostWithIP("host-rack-01-f3zlaaa", "192.0.2.1"),
			hostWithIP("host-rack-01-0papaaa", "192.0.2.2"),
		}}
		if reversed {
			slices.Reverse(st.Machines)
		}
		return st
	}
	sameID := &matclient.Status{Schema: matclient.SchemaV2, Machines: []matclient.Device{
		hostWithIP("host-1", "192.0.2.9"), hostWithIP("host-1", "192.0.2.3"),
	}}
	tests := []struct {
		name         string
		st           func(t *testing.T) *matclient.Status
		wantServices []string
		wantHeld     []Hold // Detail not compared
		wantIP       string // BMC IP of the first Service
	}{
		{"duplicate BMC IP: smallest mat_id wins",
			func(t *testing.T) *matclient.Status { return dupIP(t, false) },
			[]string{"mat-bmc-host-0c6f3a52-91d-a35882de"},
			[]Hold{{MatID: "4e8a1d27-6c3b-4f90-b5a2-7d1e0f9c8b63", Name: ServiceName(MachineTypeHost, "4e8a1d27-6c3b-4f90-b5a2-7d1e0f9c8b63"), Reason: HoldDuplicateBMCIP}},
			"10.96.66.10"},
		{"duplicate BMC IP, body reversed: same winner",
			func(t *testing.T) *matclient.Status { return dupIP(t, true) },
			[]string{"mat-bmc-host-0c6f3a52-91d-a35882de"},
			[]Hold{{MatID: "4e8a1d27-6c3b-4f90-b5a2-7d1e0f9c8b63", Name: ServiceName(MachineTypeHost, "4e8a1d27-6c3b-4f90-b5a2-7d1e0f9c8b63"), Reason: HoldDuplicateBMCIP}},
			"10.96.66.10"},
		{"name collision: smallest mat_id wins",
			func(*testing.T) *matclient.Status { return collide(false) },
			[]string{"mat-bmc-host-host-rack-01-0adeb684"},
			[]Hold{{MatID: "host-rack-01-f3zlaaa", Name: "mat-bmc-host-host-rack-01-0adeb684", Reason: HoldNameCollision}},
			"192.0.2.2"},
		{"name collision, body reversed: same winner",
			func(*testing.T) *matclient.Status { return collide(true) },
			[]string{"mat-bmc-host-host-rack-01-0adeb684"},
			[]Hold{{MatID: "host-rack-01-f3zlaaa", Name: "mat-bmc-host-host-rack-01-0adeb684", Reason: HoldNameCollision}},
			"192.0.2.2"},
		{"upper-case id and its lower-case sanitised twin: no collision",
			func(*testing.T) *matclient.Status {
				return &matclient.Status{Schema: matclient.SchemaV2, Machines: []matclient.Device{
					hostWithIP("ABCDEFGHIJKL-8ivfz8il", "192.0.2.1"),
					hostWithIP("abcdefghijkl-zj2qufnd", "192.0.2.2"),
				}}
			},
			[]string{"mat-bmc-host-abcdefghijkl-40516634", "mat-bmc-host-abcdefghijkl-f288a2104c980bf4"},
			nil, "192.0.2.2"},
		{"same mat_id twice (hand-built): first in body wins",
			func(*testing.T) *matclient.Status { return sameID },
			[]string{"mat-bmc-host-host-1"},
			[]Hold{{MatID: "host-1", Name: "mat-bmc-host-host-1", Reason: HoldNameCollision}},
			"192.0.2.9"},
		{"legacy body: host without BMC IP held, its DPUs get Services",
			func(t *testing.T) *matclient.Status { return loadStatus(t, "legacy-small.json") },
			nil, nil, ""},
		{"empty status",
			func(t *testing.T) *matclient.Status { return loadStatus(t, "v2-empty.json") },
			[]string{}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.st(t)
			d := Build(testInstance(), st, testOptions(IPModeClusterIP))
			for _, s := range d.Services {
				checkValid(t, s)
			}
			if tc.wantServices == nil { // legacy: derive from the body
				checkEveryDeviceAccountedFor(t, st, d)
				return
			}
			if got := names(d.Services); !slices.Equal(got, tc.wantServices) {
				t.Errorf("services %v, want %v", got, tc.wantServices)
			}
			held := slices.Clone(d.Held)
			for i := range held {
				if held[i].Detail == "" && held[i].Reason != HoldNoBMCIP {
					t.Errorf("hold %+v without detail", held[i])
				}
				held[i].Detail = ""
			}
			if !reflect.DeepEqual(held, tc.wantHeld) {
				t.Errorf("held %+v, want %+v", held, tc.wantHeld)
			}
			if tc.wantIP != "" && d.Services[0].Spec.ClusterIP != tc.wantIP {
				t.Errorf("winner has IP %s, want %s", d.Services[0].Spec.ClusterIP, tc.wantIP)
			}
		})
	}
}

// checkEveryDeviceAccountedFor: each device has either its Service or a
// HoldNoBMCIP (for bodies without duplicates).
func checkEveryDeviceAccountedFor(t *testing.T, st *matclient.Status, d Desired) {
	t.Helper()
	n := 0
	st.Walk(func(dev, parent *matclient.Device) {
		n++
		name := ServiceName(MachineTypeOf(dev.Kind), dev.MatID)
		hasSvc := slices.ContainsFunc(d.Services, func(s *corev1.Service) bool { return s.Name == name })
		held := slices.Contains(d.Held, Hold{MatID: dev.MatID, Name: name, Reason: HoldNoBMCIP})
		if hasSvc == held || hasSvc != (dev.BMC.IP != "") {
			t.Errorf("%s (ip %q): service %v held %v", dev.MatID, dev.BMC.IP, hasSvc, held)
		}
		if parent != nil && MachineTypeOf(dev.Kind) != MachineTypeDPU {
			t.Errorf("%s: nested but not a DPU", dev.MatID)
		}
	})
	if n != len(d.Services)+len(d.Held) {
		t.Errorf("%d devices, %d services + %d held", n, len(d.Services), len(d.Held))
	}
}

// TestBuildLongIDs: awkward ids give valid names and label values, and the
// full id stays in the annotation.
func TestBuildLongIDs(t *testing.T) {
	st := loadStatus(t, "long-ids.json")
	d := Build(Instance{Key: "static-" + longSwitchID, PodName: "Pod_With.Upper-"}, st, Options{Namespace: "bmc"})
	checkEveryDeviceAccountedFor(t, st, d)
	seen := map[string]bool{}
	for _, s := range d.Services {
		checkValid(t, s)
		id := s.Annotations[AnnotationMatID]
		if seen[id] {
			t.Errorf("mat_id %q twice", id)
		}
		seen[id] = true
		if s.Labels[LabelMatID] != LabelValue(id) || len(s.Labels[LabelMatID]) > 63 {
			t.Errorf("%s: mat-id label %q for %q", s.Name, s.Labels[LabelMatID], id)
		}
		if s.Spec.Selector[PodNameLabel] != LabelValue("Pod_With.Upper-") || s.Labels[LabelPodName] != LabelValue("Pod_With.Upper-") {
			t.Errorf("%s: pod selector %v label %q", s.Name, s.Spec.Selector, s.Labels[LabelPodName])
		}
		if s.Labels[LabelManagedBy] != DefaultManagedBy {
			t.Errorf("%s: managed-by %q", s.Name, s.Labels[LabelManagedBy])
		}
	}
	if len(seen) != 12 {
		t.Errorf("%d Services, want 12", len(seen))
	}
}

// TestBuildNilStatus: no status means no knowledge, never "no devices".
func TestBuildNilStatus(t *testing.T) {
	d := Build(testInstance(), nil, testOptions(IPModeClusterIP))
	if !d.NoStatus || d.Services != nil || d.Held != nil || d.Instance != "mat-ns.mat-bmc-mock" {
		t.Errorf("%+v", d)
	}
}

// TestBuildDoesNotAlias: Build neither modifies nor shares its inputs.
func TestBuildDoesNotAlias(t *testing.T) {
	st := loadStatus(t, "v2-mixed.json")
	pristine := loadStatus(t, "v2-mixed.json")
	inst := testInstance()
	inst.PodName = "mat-0"
	opts := testOptions(IPModeClusterIP)
	d := Build(inst, st, opts)
	if !reflect.DeepEqual(st, pristine) {
		t.Error("status modified")
	}
	d.Services[0].Spec.Selector["x"] = "y"
	d.Services[0].OwnerReferences[0].Name = "changed"
	if len(opts.TargetSelector) != 1 || inst.Owner.Name != "mat" {
		t.Error("Build shares the selector or owner with its inputs")
	}
	if _, ok := d.Services[1].Spec.Selector["x"]; ok {
		t.Error("Services share a selector map")
	}
}
