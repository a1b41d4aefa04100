package plan

import (
	"reflect"
	"slices"
	"testing"

	"github.com/matbus/matbus/matclient"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// partialFixture mixes valid and invalid devices (see TestBuildPartialFixture).
const partialFixture = "partial/v2-mixed-partial.json"

// apiPortErrors returns what the API server's Service validation says
// about ports: duplicate names, duplicate (protocol, port) pairs.
func apiPortErrors(svc *corev1.Service) []string {
	var errs []string
	type key struct {
		proto corev1.Protocol
		port  int32
	}
	names, pairs := map[string]bool{}, map[key]bool{}
	for _, p := range svc.Spec.Ports {
		if names[p.Name] {
			errs = append(errs, "duplicate name "+p.Name)
		}
		names[p.Name] = true
		k := key{p.Protocol, p.Port}
		if pairs[k] {
			errs = append(errs, "duplicate port "+string(p.Protocol)+"/"+p.TargetPort.String())
		}
		pairs[k] = true
	}
	return errs
}

// TestBuildPorts: an endpoint that would give the Service a second port
// with the same protocol and port is left out (redfish before ipmi before
// ssh) and reported once per device; everything the API server accepts
// is kept.
func TestBuildPorts(t *testing.T) {
	ep := func(reach, listen uint16) *matclient.Endpoint {
		return &matclient.Endpoint{ReachablePort: reach, ListenPort: listen}
	}
	type port struct {
		name   string
		proto  corev1.Protocol
		port   int32
		target int32
	}
	redfish := port{PortRedfish, corev1.ProtocolTCP, 443, 1266}
	tests := []struct {
		name        string
		ipmi, ssh   *matclient.Endpoint
		want        []port
		wantWarning string // "" = no warning
	}{
		{"redfish only", nil, nil, []port{redfish}, ""},
		{"ssh on the redfish port: ssh left out", nil, ep(443, 2222), []port{redfish},
			"ssh TCP port 443 (listen 2222) left out: redfish uses TCP port 443"},
		{"ssh on the redfish port with the same listen port: left out", nil, ep(443, 1266), []port{redfish},
			"ssh TCP port 443 (listen 1266) left out: redfish uses TCP port 443"},
		{"ssh on the redfish targetPort only: both kept", nil, ep(22, 1266),
			[]port{redfish, {PortSSH, corev1.ProtocolTCP, 22, 1266}}, ""},
		{"ipmi on the redfish port number: kept (UDP)", ep(443, 443), nil,
			[]port{redfish, {PortIPMI, corev1.ProtocolUDP, 443, 443}}, ""},
		{"ipmi and ssh on one port number: kept (UDP and TCP)", ep(2222, 2222), ep(2222, 2222),
			[]port{redfish, {PortIPMI, corev1.ProtocolUDP, 2222, 2222}, {PortSSH, corev1.ProtocolTCP, 2222, 2222}}, ""},
		{"ssh on the redfish port, ipmi fine: only ssh left out", ep(623, 16022), ep(443, 2222),
			[]port{redfish, {PortIPMI, corev1.ProtocolUDP, 623, 16022}},
			"ssh TCP port 443 (listen 2222) left out: redfish uses TCP port 443"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dev := hostWithIP("host-1", "192.0.2.1")
			dev.BMC.IPMI, dev.BMC.SSH = tc.ipmi, tc.ssh
			st := &matclient.Status{Schema: matclient.SchemaV2, Machines: []matclient.Device{dev}}
			d := Build(testInstance(), st, testOptions(IPModeClusterIP))
			if len(d.Services) != 1 {
				t.Fatalf("services %v", names(d.Services))
			}
			svc := d.Services[0]
			checkValid(t, svc)
			if errs := apiPortErrors(svc); len(errs) > 0 {
				t.Errorf("the API server would reject %s: %v", svc.Name, errs)
			}
			var got []port
			for _, p := range svc.Spec.Ports {
				got = append(got, port{p.Name, p.Protocol, p.Port, p.TargetPort.IntVal})
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ports %v, want %v", got, tc.want)
			}
			for _, a := range []struct {
				key string
				e   *matclient.Endpoint
				p   string
			}{{AnnotationIPMIPort, tc.ipmi, PortIPMI}, {AnnotationSSHPort, tc.ssh, PortSSH}} {
				_, has := svc.Annotations[a.key]
				inService := slices.ContainsFunc(got, func(p port) bool { return p.name == a.p })
				if has != inService {
					t.Errorf("annotation %s present %v, port in the Service %v", a.key, has, inService)
				}
			}
			var want []Warning
			if tc.wantWarning != "" {
				want = []Warning{{MatID: "host-1", Name: "mat-bmc-host-host-1", Detail: tc.wantWarning}}
			}
			if !reflect.DeepEqual(d.Warnings, want) {
				t.Errorf("warnings %+v, want %+v", d.Warnings, want)
			}
		})
	}
}

// TestBuildWarningsSorted: one warning per device, sorted by name; held
// devices get none.
func TestBuildWarningsSorted(t *testing.T) {
	ssh443 := &matclient.Endpoint{ReachablePort: 443, ListenPort: 2222}
	var devs []matclient.Device
	for _, dev := range []struct{ id, ip string }{
		{"host-c", "192.0.2.3"}, {"host-a", "192.0.2.1"}, {"host-b", "192.0.2.2"}, {"host-d", ""}, // host-d: held
	} {
		d := hostWithIP(dev.id, dev.ip)
		if dev.id != "host-b" {
			d.BMC.SSH = ssh443
		}
		devs = append(devs, d)
	}
	d := Build(testInstance(), &matclient.Status{Schema: matclient.SchemaV2, Machines: devs}, testOptions(IPModeClusterIP))
	var got []string
	for _, w := range d.Warnings {
		got = append(got, w.Name)
	}
	if want := []string{"mat-bmc-host-host-a", "mat-bmc-host-host-c"}; !slices.Equal(got, want) {
		t.Errorf("warnings for %v, want %v", got, want)
	}
}

// TestBuildPartialFixture: the invalid devices of a decoded status are
// held with HoldInvalidDevice (named as the Services they would get),
// the valid ones get their Services, the SSH on the Redfish port is left
// out with a warning.
func TestBuildPartialFixture(t *testing.T) {
	st := loadStatus(t, partialFixture)
	d := Build(testInstance(), st, testOptions(IPModeClusterIP))
	wantServices := []string{
		"mat-bmc-dpu-2458e540-24e-879b716a",
		"mat-bmc-dpu-9b8d41e8-ad4-b3d5aa50",
		"mat-bmc-host-1a530254-57f-964ececc",
		host7ec7,
		host922f,
		"mat-nvos-1a530254-57f-964ececc",
	}
	if got := names(d.Services); !slices.Equal(got, wantServices) {
		t.Errorf("services %v\nwant %v", got, wantServices)
	}
	const ps = "624423f1-04b4-404c-8d55-d1cb82fa8ae4"
	wantHeld := []Hold{
		{MatID: "", Name: "", Reason: HoldInvalidDevice, Detail: "machines[6]: mat_id: empty"},
		{MatID: "923c3a06-0b09-4573-a4da-142c606ae61e", Name: "mat-bmc-dpu-923c3a06-0b0-51bc17a6", Reason: HoldNoBMCIP},
		{MatID: "a15919aa-5727-4fb9-84e9-2980007cfc58", Name: dpuA159, Reason: HoldInvalidDevice,
			Detail: `machines[0].dpus[1]: bmc.ip: "10.96.64.300" is not an IPv4 address`},
		{MatID: ps, Name: "mat-bmc-host-624423f1-04b-216d49b5", Reason: HoldInvalidDevice,
			Detail: "machines[5]: mat_id: duplicate mat_id, also at machines[7]"},
		{MatID: ps, Name: "mat-bmc-host-624423f1-04b-216d49b5", Reason: HoldInvalidDevice,
			Detail: "machines[7]: mat_id: duplicate mat_id, also at machines[5]"},
		{MatID: "d171a368-ea6a-45f5-9b66-6767052fe916", Name: hostD171, Reason: HoldNoBMCIP},
		{MatID: "d5bb3746-fdf8-424d-ba9d-3d7d407756a9", Name: "mat-bmc-host-d5bb3746-fdf-4f4ad08b", Reason: HoldInvalidDevice,
			Detail: "machines[4]: bmc.redfish.listen_port: 70000 is out of range 1..65535"},
	}
	if !reflect.DeepEqual(d.Held, wantHeld) {
		t.Errorf("held:\n%+v\nwant\n%+v", d.Held, wantHeld)
	}
	wantWarnings := []Warning{{MatID: "7ec7b7c3-126b-412a-babf-fd79d002e921", Name: host7ec7,
		Detail: "ssh TCP port 443 (listen 2222) left out: redfish uses TCP port 443"}}
	if !reflect.DeepEqual(d.Warnings, wantWarnings) {
		t.Errorf("warnings %+v, want %+v", d.Warnings, wantWarnings)
	}
	for _, s := range d.Services {
		checkValid(t, s)
		if errs := apiPortErrors(s); len(errs) > 0 {
			t.Errorf("%s: %v", s.Name, errs)
		}
	}
	if !d.DeletesHeld() {
		t.Error("DeletesHeld = false with invalid devices")
	}
}

func TestDesiredDeletesHeld(t *testing.T) {
	tests := []struct {
		name string
		d    Desired
		want bool
	}{
		{"nothing held", Desired{}, false},
		{"no status", Desired{NoStatus: true}, true},
		{"held for other reasons", Desired{Held: []Hold{{MatID: "a", Reason: HoldNoBMCIP}, {MatID: "b", Reason: HoldDuplicateBMCIP},
			{MatID: "c", Reason: HoldNameCollision}}}, false},
		{"an invalid device", Desired{Held: []Hold{{MatID: "a", Reason: HoldNoBMCIP}, {Reason: HoldInvalidDevice}}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.d.DeletesHeld(); got != tc.want {
				t.Errorf("DeletesHeld = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDiffInvalidDevicesHoldDeletes: against the Services of v2-mixed
// (plus one of a vanished device), a status with invalid devices deletes
// nothing, while the valid devices are still created, updated and
// recreated; without the invalid entries the same status deletes.
func TestDiffInvalidDevicesHoldDeletes(t *testing.T) {
	const gone = "mat-bmc-host-gone"
	opts := testOptions(IPModeClusterIP)
	inst := testInstance()
	existing := func(t *testing.T, without ...string) []*corev1.Service {
		api := deployed(t, "v2-mixed.json", inst, opts)
		for _, n := range without {
			delete(api.svcs, n)
		}
		api.svcs[gone] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{
			Name: gone, Namespace: "bmc", UID: types.UID("uid-gone"),
			Labels:      map[string]string{LabelManagedBy: DefaultManagedBy, LabelInstance: "mat-ns.mat-bmc-mock", LabelMatID: "gone"},
			Annotations: map[string]string{AnnotationMatID: "gone"},
		}}
		return api.list()
	}
	const (
		switch1a53 = "mat-bmc-host-1a530254-57f-964ececc"
		dpu9b8d    = "mat-bmc-dpu-9b8d41e8-ad4-b3d5aa50"
		switchD5bb = "mat-bmc-host-d5bb3746-fdf-4f4ad08b"
		shelf6244  = "mat-bmc-host-624423f1-04b-216d49b5"
	)
	tests := []struct {
		name     string
		status   func(st *matclient.Status)
		existing func(t *testing.T) []*corev1.Service
		want     planNames
	}{
		{"invalid devices: nothing deleted, the valid host updated (ssh left out)",
			func(*matclient.Status) {}, func(t *testing.T) []*corev1.Service { return existing(t) },
			pn(nil, []string{host7ec7}, nil, nil, nil)},
		{"invalid devices: a missing valid device's Service created",
			func(*matclient.Status) {}, func(t *testing.T) []*corev1.Service { return existing(t, switch1a53) },
			pn([]string{switch1a53}, []string{host7ec7}, nil, nil, nil)},
		{"invalid devices: a moved BMC IP recreated",
			func(st *matclient.Status) { st.Machines[1].DPUs[0].BMC.IP = "10.96.64.51" },
			func(t *testing.T) []*corev1.Service { return existing(t) },
			pn(nil, []string{host7ec7}, []string{dpu9b8d}, nil, nil)},
		{"same status without invalid entries: the vanished devices' Services deleted",
			func(st *matclient.Status) { st.Invalid = nil },
			func(t *testing.T) []*corev1.Service { return existing(t) },
			pn(nil, []string{host7ec7}, nil, []string{dpuA159, shelf6244, switchD5bb, gone}, nil)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := loadStatus(t, partialFixture)
			tc.status(st)
			d := Build(inst, st, opts)
			have := tc.existing(t)
			p := Diff(d, have, opts)
			if got := summarize(p); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan %+v\nwant %+v", got, tc.want)
			}
			for _, u := range p.Update {
				if u.New.Name == host7ec7 {
					for _, sp := range u.New.Spec.Ports {
						if sp.Name == PortSSH || sp.TargetPort == intstr.FromInt32(2222) {
							t.Errorf("%s keeps port %+v", host7ec7, sp)
						}
					}
					if _, ok := u.New.Annotations[AnnotationSSHPort]; ok {
						t.Errorf("%s keeps the ssh annotation", host7ec7)
					}
				}
			}
			newFakeAPI(t, have...).apply(p) // the API server accepts the plan
		})
	}
}
