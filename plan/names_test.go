package plan

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/matbus/matbus/matclient"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

const longSwitchID = "mat-switch-rack-0001-tray-09-nvlink-nd5200-ld-serial-sn000000000000001"

// TestServiceNameUpstreamTable checks every row of the fixtures README table
// "Service names the upstream rule produces for long-ids.json": the old
// rule gives the listed name with the listed validity, and ServiceName keeps
// it when valid and otherwise gives a valid name with the hash of the
// original id.
func TestServiceNameUpstreamTable(t *testing.T) {
	nonASCII := "hôte-ümlaüt-0001"
	tests := []struct {
		name       string
		matID      string
		typ        MachineType
		upstream   string // README "Upstream name"
		validDNS   bool   // README "Valid DNS-1035 name?"
		validLabel bool   // README "Valid label value?" (of the mat_id)
		want       string
	}{
		{"uuid host", "5d1c0a77-3b2e-4f61-8c90-1a2b3c4d5e6f", MachineTypeHost,
			"mat-bmc-host-5d1c0a77-3b2-b2805448", true, true, "mat-bmc-host-5d1c0a77-3b2-b2805448"},
		{"uuid dpu", "0b9e2c41-7d3a-4e85-a1f0-3c5d7e9f1b2d", MachineTypeDPU,
			"mat-bmc-dpu-0b9e2c41-7d3-4ddd078d", true, true, "mat-bmc-dpu-0b9e2c41-7d3-4ddd078d"},
		{"uuid sharing 12-char prefix", "5d1c0a77-3b2e-4a00-9f11-ffeeddccbbaa", MachineTypeHost,
			"mat-bmc-host-5d1c0a77-3b2-2b6ee8ab", true, true, "mat-bmc-host-5d1c0a77-3b2-2b6ee8ab"},
		{"12 bytes kept", "host-abcd-12", MachineTypeHost,
			"mat-bmc-host-host-abcd-12", true, true, "mat-bmc-host-host-abcd-12"},
		{"13 bytes hashed", "host-abcd-123", MachineTypeHost,
			"mat-bmc-host-host-abcd-12-3716bca3", true, true, "mat-bmc-host-host-abcd-12-3716bca3"},
		{"12th byte dash", "abcdefghijk-xyz", MachineTypeHost,
			"mat-bmc-host-abcdefghijk--7e57583d", true, true, "mat-bmc-host-abcdefghijk--7e57583d"},
		{"upper-case uuid", "3F2B6C1E-8A4D-4C2B-9E7F-0A1B2C3D4E5F", MachineTypeHost,
			"mat-bmc-host-3F2B6C1E-8A4-14efda34", false, true, "mat-bmc-host-3f2b6c1e-8a4-f3c62d8062c59e54"},
		{"underscore dot upper", "Rack1_Host.01", MachineTypeHost,
			"mat-bmc-host-Rack1_Host.0-f85af4b9", false, true, "mat-bmc-host-rack1-host-0-5566d572156e82b9"},
		{"short with underscore", "Node_7", MachineTypeHost,
			"mat-bmc-host-Node_7", false, true, "mat-bmc-host-node-7-cfa945d5fb439053"},
		{"trailing dash", "trailing-", MachineTypeHost,
			"mat-bmc-host-trailing-", false, false, "mat-bmc-host-trailing-fe043b6eee4442a8"},
		{"70-char switch id", longSwitchID, MachineTypeSwitch,
			"mat-bmc-host-mat-switch-r-11524c59", true, false, "mat-bmc-host-mat-switch-r-11524c59"},
		{"non-ASCII power shelf", nonASCII, MachineTypePowerShelf,
			nonASCII[:12] + "-9b1eead0", false, false, "mat-bmc-host-h-te-mla-t-0-3231bca52db6a810"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			upstream := "mat-bmc-" + tc.typ.nameToken() + "-" + legacyID(tc.matID)
			if tc.matID == nonASCII {
				upstream = legacyID(tc.matID) // the README gives only the id part
				if utf8.ValidString(upstream) {
					t.Errorf("12-byte cut of %q should split a UTF-8 character", tc.matID)
				}
			}
			if upstream != tc.upstream {
				t.Errorf("upstream rule: got %q, README says %q", upstream, tc.upstream)
			}
			full := "mat-bmc-" + tc.typ.nameToken() + "-" + legacyID(tc.matID)
			if got := len(validation.IsDNS1035Label(full)) == 0; got != tc.validDNS {
				t.Errorf("upstream %q valid DNS-1035 = %v, README says %v", full, got, tc.validDNS)
			}
			if got := len(validation.IsValidLabelValue(tc.matID)) == 0; got != tc.validLabel {
				t.Errorf("mat_id %q valid label value = %v, README says %v", tc.matID, got, tc.validLabel)
			}
			lv := LabelValue(tc.matID)
			if errs := validation.IsValidLabelValue(lv); len(errs) > 0 {
				t.Errorf("LabelValue(%q) = %q: %v", tc.matID, lv, errs)
			}
			if (lv == tc.matID) != tc.validLabel {
				t.Errorf("LabelValue(%q) = %q: kept must equal valid (%v)", tc.matID, lv, tc.validLabel)
			}

			got := ServiceName(tc.typ, tc.matID)
			if got != tc.want {
				t.Errorf("ServiceName(%s, %q) = %q, want %q", tc.typ, tc.matID, got, tc.want)
			}
			if tc.validDNS && got != full {
				t.Errorf("valid upstream name %q not kept: %q", full, got)
			}
			if errs := validation.IsDNS1035Label(got); len(errs) > 0 {
				t.Errorf("%q: %v", got, errs)
			}
			if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
				t.Errorf("%q as label value: %v", got, errs)
			}
			if !tc.validDNS && !strings.HasSuffix(got, "-"+hash16(tc.matID)) {
				t.Errorf("%q does not end in the 64-bit hash of the original id", got)
			}
		})
	}
}

// TestServiceNameV2MixedHashes checks the README's list of names for the
// v2-mixed.json devices.
func TestServiceNameV2MixedHashes(t *testing.T) {
	st := loadStatus(t, "v2-mixed.json")
	tests := []struct{ prefix, want string }{
		{"922f3d9b", "mat-bmc-host-922f3d9b-20b-4da64654"},
		{"2458e540", "mat-bmc-dpu-2458e540-24e-879b716a"},
		{"a15919aa", "mat-bmc-dpu-a15919aa-572-726d4120"},
		{"7ec7b7c3", "mat-bmc-host-7ec7b7c3-126-c030b365"},
		{"9b8d41e8", "mat-bmc-dpu-9b8d41e8-ad4-b3d5aa50"},
		{"d171a368", "mat-bmc-host-d171a368-ea6-3f95c484"},
		{"923c3a06", "mat-bmc-dpu-923c3a06-0b0-51bc17a6"},
		{"1a530254", "mat-bmc-host-1a530254-57f-964ececc"},
		{"d5bb3746", "mat-bmc-host-d5bb3746-fdf-4f4ad08b"},
		{"624423f1", "mat-bmc-host-624423f1-04b-216d49b5"},
	}
	for _, tc := range tests {
		t.Run(tc.prefix, func(t *testing.T) {
			d := device(t, st, tc.prefix)
			if got := ServiceName(MachineTypeOf(d.Kind), d.MatID); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMachineTypeOf(t *testing.T) {
	tests := []struct {
		kind matclient.DeviceKind
		want MachineType
	}{
		{matclient.KindMachine, MachineTypeHost},
		{matclient.KindDPU, MachineTypeDPU},
		{matclient.KindSwitch, MachineTypeSwitch},
		{matclient.KindPowerShelf, MachineTypePowerShelf},
		{"", MachineTypeHost},
	}
	for _, tc := range tests {
		t.Run(string(tc.kind), func(t *testing.T) {
			if got := MachineTypeOf(tc.kind); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLabelValue(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"uuid unchanged", "922f3d9b-20be-461f-9b69-90928701ce93", "922f3d9b-20be-461f-9b69-90928701ce93"},
		{"instance key unchanged", "mat-ns.mat-bmc-mock", "mat-ns.mat-bmc-mock"},
		{"upper underscore dot unchanged", "Rack1_Host.01", "Rack1_Host.01"},
		{"63 bytes unchanged", strings.Repeat("a", 63), strings.Repeat("a", 63)},
		{"dash and 16 hex unchanged", "node-0123456789abcdef", "node-0123456789abcdef"},
		{"underscore and 16 upper-case hex unchanged", "node_0123456789ABCDEF", "node_0123456789ABCDEF"},
		{"underscore and 15 hex unchanged", "node_0123456789abcde", "node_0123456789abcde"},
		{"pod name unchanged", "mat-7d9f8c6b5-x2x4z", "mat-7d9f8c6b5-x2x4z"},
		{"64 bytes hashed", strings.Repeat("a", 64), strings.Repeat("a", 46) + "_db007849f35ebbe5"},
		{"70-char id", longSwitchID, "mat-switch-rack-0001-tray-09-nvlink-nd5200-ld_1d0ee0fe1b022f59"},
		{"trailing dash", "trailing-", "trailing_fe043b6eee4442a8"},
		{"leading dash", "-lead", "lead_19d6cc09b7d6335e"},
		{"non-ASCII", "hôte-ümlaüt-0001", "h-te-mla-t-0001_3231bca52db6a810"},
		{"nothing usable", "___", "h_b8c3741a0c665b74"},
		{"space", "Power Shelf", "Power-Shelf_c00e86a8510edf72"},
		{"valid but of the hashed shape", "node_0123456789abcdef", "node_0123456789abcdef_" + hash16("node_0123456789abcdef")},
		{"a hashed value is hashed again", "trailing_fe043b6eee4442a8", "trailing_fe043b6eee4442a8_" + hash16("trailing_fe043b6eee4442a8")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := LabelValue(tc.in)
			if got != tc.want {
				t.Errorf("LabelValue(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
				t.Errorf("%q: %v", got, errs)
			}
		})
	}
}

func TestParseIPMode(t *testing.T) {
	tests := []struct {
		in      string
		want    IPMode
		wantErr bool
	}{
		{"cluster-ip", IPModeClusterIP, false},
		{"external-ip", IPModeExternalIP, false},
		{" External-IP ", IPModeExternalIP, false},
		{"", "", true},
		{"clusterIP", "", true},
		{"loadbalancer", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseIPMode(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ParseIPMode(%q) = %q, %v; want %q, err %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestInstanceSelector(t *testing.T) {
	tests := []struct {
		name   string
		opts   Options
		key    string
		labels labels.Set
		want   bool
	}{
		{"default managed-by", Options{}, "ns.mat",
			labels.Set{LabelManagedBy: DefaultManagedBy, LabelInstance: "ns.mat", "x": "y"}, true},
		{"other instance", Options{}, "ns.mat",
			labels.Set{LabelManagedBy: DefaultManagedBy, LabelInstance: "ns.other"}, false},
		{"old controller (no instance label)", Options{}, "ns.mat",
			labels.Set{LabelManagedBy: DefaultManagedBy}, false},
		{"custom managed-by", Options{ManagedBy: "matbus"}, "ns.mat",
			labels.Set{LabelManagedBy: "matbus", LabelInstance: "ns.mat"}, true},
		{"other managed-by", Options{ManagedBy: "matbus"}, "ns.mat",
			labels.Set{LabelManagedBy: DefaultManagedBy, LabelInstance: "ns.mat"}, false},
		{"long key hashed", Options{}, longSwitchID,
			labels.Set{LabelManagedBy: DefaultManagedBy, LabelInstance: LabelValue(longSwitchID)}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := InstanceSelector(tc.opts, tc.key).Matches(tc.labels); got != tc.want {
				t.Errorf("%s matches %v = %v, want %v", InstanceSelector(tc.opts, tc.key), tc.labels, got, tc.want)
			}
		})
	}
}
