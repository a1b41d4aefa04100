package plan

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/matbus/matbus/matclient"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	nd5200   = "1a530254-57f0-4a8d-adb9-7d5520153f50" // v2-mixed switch with nvos_ip 10.98.0.20
	nvosName = "mat-nvos-1a530254-57f-964ececc"
)

// TestBuildNVOS compares the NVOS Service of the ND5200 switch of
// v2-mixed.json field by field in both modes; the N5700 (no nvos_ip) and a
// host that reports one get none.
func TestBuildNVOS(t *testing.T) {
	base := func() *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{
				Name:      nvosName,
				Namespace: "bmc",
				Labels: map[string]string{
					LabelManagedBy:   "mat-k8s-controller",
					LabelInstance:    "mat-ns.mat-bmc-mock",
					LabelMatID:       nd5200,
					LabelMachineType: "nvos",
					LabelDeviceKind:  "nvos",
				},
				Annotations: map[string]string{
					AnnotationMatID:        nd5200,
					AnnotationNVOSIP:       "10.98.0.20",
					AnnotationHardwareType: "nvidia_switch_nd5200_ld",
				},
				OwnerReferences: []metav1.OwnerReference{testOwner},
			},
			Spec: corev1.ServiceSpec{
				Type:     corev1.ServiceTypeClusterIP,
				Ports:    []corev1.ServicePort{{Name: "nmxc", Protocol: corev1.ProtocolTCP, Port: 9370, TargetPort: intstr.FromInt32(1266)}},
				Selector: map[string]string{"app": "machine-a-tron"},
			},
		}
	}
	for _, mode := range []IPMode{IPModeClusterIP, IPModeExternalIP} {
		t.Run(string(mode), func(t *testing.T) {
			st := loadStatus(t, "v2-mixed.json")
			// A host reporting an nvos_ip gets no NVOS Service.
			device(t, st, "922f3d9b").NvosIP = "10.98.0.99"
			opts := testOptions(mode)
			opts.StateAnnotations = true // never on NVOS Services
			d := Build(testInstance(), st, opts)
			var nvos []*corev1.Service
			for _, s := range d.Services {
				if strings.HasPrefix(s.Name, "mat-nvos-") {
					nvos = append(nvos, s)
				}
			}
			if len(nvos) != 1 {
				t.Fatalf("NVOS Services %v, want only %s", names(nvos), nvosName)
			}
			want := base()
			if mode == IPModeExternalIP {
				want.Spec.ExternalIPs = []string{"10.98.0.20"}
			} else {
				want.Spec.ClusterIP = "10.98.0.20"
				want.Spec.ClusterIPs = []string{"10.98.0.20"}
			}
			if !reflect.DeepEqual(nvos[0], want) {
				t.Errorf("NVOS Service differs\n got: %+v\nwant: %+v", nvos[0], want)
			}
			checkValid(t, nvos[0])
			if got := ServiceIP(nvos[0]); got != "10.98.0.20" {
				t.Errorf("ServiceIP = %q", got)
			}
			if d.Held == nil || slices.ContainsFunc(d.Held, func(h Hold) bool { return h.MatID == nd5200 }) {
				t.Errorf("held %+v", d.Held)
			}
		})
	}
}

// TestBuildNVOSWithoutBMCIP: a switch whose BMC has no IP yet still gets
// its NVOS Service; the BMC is held.
func TestBuildNVOSWithoutBMCIP(t *testing.T) {
	st := loadStatus(t, "v2-mixed.json")
	device(t, st, "1a530254").BMC.IP = ""
	d := Build(testInstance(), st, testOptions(IPModeClusterIP))
	got := names(d.Services)
	if !slices.Contains(got, nvosName) || slices.Contains(got, "mat-bmc-host-1a530254-57f-964ececc") {
		t.Errorf("services %v", got)
	}
	if !slices.ContainsFunc(d.Held, func(h Hold) bool { return h.MatID == nd5200 && h.Reason == HoldNoBMCIP }) {
		t.Errorf("held %+v", d.Held)
	}
}

// TestBuildNVOSDuplicateIP: NVOS and BMC IPs are one pool under the
// duplicate-IP policy, whatever the body order.
func TestBuildNVOSDuplicateIP(t *testing.T) {
	sw := func(id, bmc, nvos string) matclient.Device {
		d := hostWithIP(id, bmc)
		d.Kind = matclient.KindSwitch
		d.NvosIP = nvos
		return d
	}
	tests := []struct {
		name      string
		devs      []matclient.Device
		wantSvcs  []string
		wantHeld  []string // names
		wantInDet string
	}{
		{"NVOS IP of a smaller mat_id beats a BMC IP",
			[]matclient.Device{hostWithIP("b-host", "10.96.1.1"), sw("a-switch", "10.96.1.2", "10.96.1.1")},
			[]string{"mat-bmc-host-a-switch", "mat-nvos-a-switch"},
			[]string{"mat-bmc-host-b-host"}, "NVOS IP"},
		{"BMC IP of a smaller mat_id beats an NVOS IP",
			[]matclient.Device{hostWithIP("a-host", "10.96.1.1"), sw("b-switch", "10.96.1.2", "10.96.1.1")},
			[]string{"mat-bmc-host-a-host", "mat-bmc-host-b-switch"},
			[]string{"mat-nvos-b-switch"}, "BMC IP"},
		{"two switches, one NVOS IP",
			[]matclient.Device{sw("b-switch", "10.96.1.2", "10.98.0.1"), sw("a-switch", "10.96.1.1", "10.98.0.1")},
			[]string{"mat-bmc-host-a-switch", "mat-bmc-host-b-switch", "mat-nvos-a-switch"},
			[]string{"mat-nvos-b-switch"}, "mat_id a-switch"},
		{"NVOS IP equal to its own BMC IP: the BMC Service wins",
			[]matclient.Device{sw("a-switch", "10.96.1.1", "10.96.1.1")},
			[]string{"mat-bmc-host-a-switch"},
			[]string{"mat-nvos-a-switch"}, "the same device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, rev := range []bool{false, true} {
				devs := slices.Clone(tc.devs)
				if rev {
					slices.Reverse(devs)
				}
				st := &matclient.Status{Machines: devs}
				d := Build(testInstance(), st, testOptions(IPModeClusterIP))
				if got := names(d.Services); !slices.Equal(got, tc.wantSvcs) {
					t.Errorf("reversed=%v: services %v, want %v", rev, got, tc.wantSvcs)
				}
				var held []string
				for _, h := range d.Held {
					held = append(held, h.Name)
					if h.Reason != HoldDuplicateBMCIP || !strings.Contains(h.Detail, tc.wantInDet) {
						t.Errorf("reversed=%v: hold %+v, want %s naming %q", rev, h, HoldDuplicateBMCIP, tc.wantInDet)
					}
				}
				if !slices.Equal(held, tc.wantHeld) {
					t.Errorf("reversed=%v: held %v, want %v", rev, held, tc.wantHeld)
				}
			}
		})
	}
}

// TestNVOSServiceNameCollisionFree: over the id corpus, NVOS names are valid
// DNS-1035 labels with the BMC name's id part, never equal to a BMC name,
// and two distinct ids share an NVOS name exactly when they share a host
// BMC name.
func TestNVOSServiceNameCollisionFree(t *testing.T) {
	ids := idCorpus(t)
	byName := make(map[string]string, len(ids))
	bmc := make(map[string]bool, 2*len(ids))
	for _, id := range ids {
		bmc[ServiceName(MachineTypeHost, id)] = true
		bmc[ServiceName(MachineTypeDPU, id)] = true
	}
	for _, id := range ids {
		name := NVOSServiceName(id)
		if !isDNS1035Label(name) || len(name) > 38 {
			t.Fatalf("NVOSServiceName(%q) = %q: not a DNS-1035 label of at most 38 bytes", id, name)
		}
		host := ServiceName(MachineTypeHost, id)
		if want := "mat-nvos-" + strings.TrimPrefix(host, "mat-bmc-host-"); name != want {
			t.Errorf("NVOSServiceName(%q) = %q, want %q (the BMC name's id part)", id, name, want)
		}
		if bmc[name] {
			t.Errorf("NVOS name %q is also a BMC name", name)
		}
		if other, ok := byName[name]; ok && other != id && ServiceName(MachineTypeHost, other) != host {
			t.Errorf("ids %q and %q share the NVOS name %q but not a BMC name", other, id, name)
		}
		byName[name] = id
	}
	if got := NVOSServiceName(nd5200); got != nvosName {
		t.Errorf("NVOSServiceName(%q) = %q, want %q", nd5200, got, nvosName)
	}
}
