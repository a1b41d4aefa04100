package plan

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/matbus/matbus/matclient"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The shapes ServiceName and LabelValue promise, written independently of
// the code under test.
var (
	// keptIDPart: every id part the old controller's rule can produce as a
	// valid name: 1..12 bytes of [a-z0-9-] not ending in "-", or 12 bytes
	// of [a-z0-9-] + "-" + 8 hex.
	keptIDPart = regexp.MustCompile(`^([a-z0-9-]{0,11}[a-z0-9]|[a-z0-9-]{12}-[0-9a-f]{8})$`)
	// hashedIDPart: x (1..12 bytes, alphanumeric at both ends) + "-" + 16
	// hex, or 16 hex alone.
	hashedIDPart = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?-)?[0-9a-f]{16}$`)
	// hashedLabel: x (alphanumeric at both ends) + "_" + 16 hex.
	hashedLabel = regexp.MustCompile(`^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?_[0-9a-f]{16}$`)
	// labelHashMark: what makes a valid label value count as hashed-shaped.
	labelHashMark = regexp.MustCompile(`_[0-9a-f]{16}$`)
)

func namePrefix(typ MachineType) string { return "mat-bmc-" + typ.nameToken() + "-" }

// oldKept reports whether the old controller's name for id is a valid
// DNS-1035 label (and so kept), as apimachinery judges it.
func oldKept(typ MachineType, id string) bool {
	return len(validation.IsDNS1035Label(namePrefix(typ)+legacyID(id))) == 0
}

// checkName checks every per-id property of ServiceName(typ, id) and
// returns the name.
func checkName(t testing.TB, typ MachineType, id string) string {
	t.Helper()
	name := ServiceName(typ, id)
	if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
		t.Errorf("ServiceName(%q) = %q: %v", id, name, errs)
	}
	if errs := validation.IsValidLabelValue(name); len(errs) > 0 {
		t.Errorf("ServiceName(%q) = %q as a label value: %v", id, name, errs)
	}
	p, ok := strings.CutPrefix(name, namePrefix(typ))
	if !ok {
		t.Fatalf("ServiceName(%s, %q) = %q lacks the prefix %q", typ, id, name, namePrefix(typ))
	}
	if oldKept(typ, id) {
		if old := namePrefix(typ) + legacyID(id); name != old {
			t.Errorf("ServiceName(%q) = %q, want the old controller's %q", id, name, old)
		}
		if !keptIDPart.MatchString(p) {
			t.Errorf("kept name %q has an id part %q outside the kept shapes", name, p)
		}
		return name
	}
	if !hashedIDPart.MatchString(p) || !strings.HasSuffix(p, hash16(id)) {
		t.Errorf("ServiceName(%q) = %q: id part %q is not x-<hash16 of the id>", id, name, p)
	}
	if keptIDPart.MatchString(p) {
		t.Errorf("hashed name %q has an id part %q that the old rule can keep", name, p)
	}
	if ServiceName(typ, p) == name {
		t.Errorf("hashed name %q is also the name of the id %q", name, p)
	}
	return name
}

// nameCollisionAllowed reports whether the distinct ids a and b may share
// a Service name: both kept long (same first 12 bytes, FNV-1a-32
// collision), or both hashed (FNV-1a-64 collision).
func nameCollisionAllowed(typ MachineType, a, b string) bool {
	ka, kb := oldKept(typ, a), oldKept(typ, b)
	switch {
	case ka && kb:
		return len(a) > legacyIDBytes && len(b) > legacyIDBytes && a[:legacyIDBytes] == b[:legacyIDBytes] && hash8(a) == hash8(b)
	case !ka && !kb:
		return hash16(a) == hash16(b)
	}
	return false
}

// labelKept reports whether LabelValue must keep s as it is.
func labelKept(s string) bool {
	return len(validation.IsValidLabelValue(s)) == 0 && !labelHashMark.MatchString(s)
}

// checkLabel checks every per-input property of LabelValue(s) and returns
// the value.
func checkLabel(t testing.TB, s string) string {
	t.Helper()
	v := LabelValue(s)
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
		t.Errorf("LabelValue(%q) = %q: %v", s, v, errs)
	}
	if labelKept(s) {
		if v != s {
			t.Errorf("LabelValue(%q) = %q, want it kept", s, v)
		}
		return v
	}
	if !hashedLabel.MatchString(v) || !strings.HasSuffix(v, "_"+hash16(s)) {
		t.Errorf("LabelValue(%q) = %q is not x_<hash16 of the input>", s, v)
	}
	if labelKept(v) || LabelValue(v) == v {
		t.Errorf("hashed value %q of %q is a value that is kept as it is", v, s)
	}
	return v
}

// labelCollisionAllowed: distinct inputs may share a value only when both
// are hashed with an FNV-1a-64 collision.
func labelCollisionAllowed(a, b string) bool {
	return !labelKept(a) && !labelKept(b) && hash16(a) == hash16(b)
}

// adversaries returns id and ids built to collide with it: case twins, its
// old-rule id part, the id parts and label value it maps to, what the old
// rule would have sanitised it to, its hash alone, its 12- and 13-byte
// cuts.
func adversaries(id string) []string {
	out := []string{id, strings.ToUpper(id), strings.ToLower(id), legacyID(id)}
	for _, typ := range []MachineType{MachineTypeHost, MachineTypeDPU} {
		p := strings.TrimPrefix(ServiceName(typ, id), namePrefix(typ))
		out = append(out, p)
		if h := hash16(id); strings.HasSuffix(p, h) {
			out = append(out, strings.TrimSuffix(p, h)+hash8(id), h)
		}
	}
	v := LabelValue(id)
	out = append(out, v, strings.ToUpper(v), strings.TrimSuffix(v, hash16(id))+hash8(id))
	if len(id) > legacyIDBytes {
		out = append(out, id[:legacyIDBytes], id[:legacyIDBytes+1])
	}
	return out
}

// idCorpus: fixture ids, edge cases and seeded random ids (lengths around
// 12, 13, 21, 63 bytes; upper case, "_", ".", " ", non-ASCII), each with
// its adversaries.
func idCorpus(t testing.TB) []string {
	seeds := []string{
		"", "a", "A", "-", "_", "0", "abc", "ABC", "Abcd", "-x", "x-", "a--b", "host-1", "Node_7", "Rack1_Host.01",
		"trailing-", "___", "ÀÉÎ", "hôte-ümlaüt-0001", "host-abcd-12", "host-abcd-123", "abcdefghijk-xyz",
		"abcdefghijkl-zj2qufnd", "ABCDEFGHIJKL-8ivfz8il", "host-rack-01-f3zlaaa", "host-rack-01-0papaaa",
		"node_0123456789abcdef", "mat-ns.mat-bmc-mock", "mat-7d9f8c6b5-x2x4z", longSwitchID,
		strings.Repeat("a", 21), strings.Repeat("a", 63), strings.Repeat("a", 64),
	}
	for _, f := range []string{"long-ids.json", "v2-mixed.json", "legacy-small.json"} {
		st := loadStatus(t, f)
		st.Walk(func(d, _ *matclient.Device) { seeds = append(seeds, d.MatID) })
	}
	alphabet := []string{"a", "b", "z", "0", "9", "-", "-", "_", ".", "A", "Z", " ", "ü", "é", "/"}
	lengths := []int{0, 1, 2, 4, 5, 11, 12, 13, 14, 17, 20, 21, 22, 29, 36, 46, 47, 62, 63, 64, 70}
	r := rand.New(rand.NewPCG(1266, 443))
	for range 1000 {
		var b strings.Builder
		for n := lengths[r.IntN(len(lengths))]; b.Len() < n; {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		seeds = append(seeds, b.String())
	}
	var ids []string
	for _, s := range seeds {
		ids = append(ids, adversaries(s)...)
	}
	return ids
}

// TestServiceNameCollisionFree: over the corpus, every name is valid, kept
// names are the old controller's, hashed names have a shape no kept name
// has, and two distinct ids share a name only when both are hashed the
// same way and their hashes collide.
func TestServiceNameCollisionFree(t *testing.T) {
	ids := idCorpus(t)
	for _, typ := range []MachineType{MachineTypeHost, MachineTypeDPU} {
		t.Run(string(typ), func(t *testing.T) {
			byName := make(map[string]string, len(ids))
			kept, hashed := 0, 0
			for _, id := range ids {
				name := checkName(t, typ, id)
				if oldKept(typ, id) {
					kept++
				} else {
					hashed++
				}
				if other, ok := byName[name]; ok && other != id && !nameCollisionAllowed(typ, other, id) {
					t.Errorf("ids %q and %q share the name %q", other, id, name)
				}
				byName[name] = id
			}
			if kept < 200 || hashed < 200 {
				t.Errorf("corpus too one-sided: %d kept, %d hashed", kept, hashed)
			}
		})
	}
}

// TestLabelValueCollisionFree: over the corpus, every value is valid,
// valid values without the hash mark are kept, and two distinct inputs
// share a value only when both are hashed and their hashes collide.
func TestLabelValueCollisionFree(t *testing.T) {
	byValue := map[string]string{}
	kept, hashed := 0, 0
	for _, s := range idCorpus(t) {
		v := checkLabel(t, s)
		if labelKept(s) {
			kept++
		} else {
			hashed++
		}
		if other, ok := byValue[v]; ok && other != s && !labelCollisionAllowed(other, s) {
			t.Errorf("inputs %q and %q share the label value %q", other, s, v)
		}
		byValue[v] = s
	}
	if kept < 200 || hashed < 200 {
		t.Errorf("corpus too one-sided: %d kept, %d hashed", kept, hashed)
	}
}

// TestServiceNameAdversarialPairs: pairs built to collide under the
// sanitising rule get distinct names; only a real hash collision of two
// kept-long names (the old controller's FNV-1a-32) shares one.
func TestServiceNameAdversarialPairs(t *testing.T) {
	tests := []struct {
		name     string
		a, b     string
		typ      MachineType
		wantSame bool
	}{
		{"upper case and its old sanitised twin", "ABC", "abc-" + hash8("ABC"), MachineTypeHost, false},
		{"upper-case uuid and its lower-case twin", "3F2B6C1E-8A4D-4C2B-9E7F-0A1B2C3D4E5F",
			"3f2b6c1e-8a4d-4c2b-9e7f-0a1b2c3d4e5f", MachineTypeHost, false},
		{"upper-case uuid and its old sanitised id part", "3F2B6C1E-8A4D-4C2B-9E7F-0A1B2C3D4E5F",
			"3f2b6c1e-8a4-14efda34", MachineTypeHost, false},
		{"upper and lower case twins", "Host-1", "host-1", MachineTypeDPU, false},
		{"sanitised 12-byte prefix shared", "abcdefghijkl-zj2qufnd", "ABCDEFGHIJKL-8ivfz8il", MachineTypeHost, false},
		{"12 and 13 bytes", "host-abcd-12", "host-abcd-123", MachineTypeHost, false},
		{"id and its kept-long id part", longSwitchID, legacyID(longSwitchID), MachineTypeHost, false},
		{"21-byte hashed id part and that part as an id", "Abcd", "abcd-" + hash16("Abcd"), MachineTypeHost, false},
		{"empty and the hash of empty", "", hash16(""), MachineTypeHost, false},
		{"empty and the old hash of empty", "", hash8(""), MachineTypeHost, false},
		{"non-ASCII and its sanitised id part", "hôte-ümlaüt-0001", "h-te-mla-t-0-" + hash16("hôte-ümlaüt-0001"), MachineTypeHost, false},
		{"underscore and dash twins", "Node_7", "node-7", MachineTypeHost, false},
		{"old-rule FNV-1a-32 collision of two kept-long ids", "host-rack-01-f3zlaaa", "host-rack-01-0papaaa", MachineTypeHost, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			na, nb := checkName(t, tc.typ, tc.a), checkName(t, tc.typ, tc.b)
			if (na == nb) != tc.wantSame {
				t.Errorf("ServiceName(%q) = %q, ServiceName(%q) = %q: same = %v, want %v", tc.a, na, tc.b, nb, na == nb, tc.wantSame)
			}
			if (na == nb) != nameCollisionAllowed(tc.typ, tc.a, tc.b) {
				t.Errorf("collision %v, but allowed = %v", na == nb, nameCollisionAllowed(tc.typ, tc.a, tc.b))
			}
		})
	}
}

// TestLabelValueAdversarialPairs: an input and the value another input
// hashes to never share a value.
func TestLabelValueAdversarialPairs(t *testing.T) {
	tests := []struct {
		name string
		a, b string
	}{
		{"trailing dash and its old hashed value", "trailing-", "trailing-" + hash8("trailing-")},
		{"trailing dash and its hashed value", "trailing-", LabelValue("trailing-")},
		{"70-char id and its hashed value", longSwitchID, LabelValue(longSwitchID)},
		{"70-char id and its old hashed value", longSwitchID, longSwitchID[:54] + "-" + hash8(longSwitchID)},
		{"nothing usable and the fallback value", "___", "h_" + hash16("___")},
		{"upper and lower case twins", "Rack1_Host.01", "rack1_host.01"},
		{"empty and the fallback", "", "h"},
		{"non-ASCII and its hashed value", "hôte-ümlaüt-0001", LabelValue("hôte-ümlaüt-0001")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			va, vb := checkLabel(t, tc.a), checkLabel(t, tc.b)
			if va == vb {
				t.Errorf("LabelValue(%q) = LabelValue(%q) = %q", tc.a, tc.b, va)
			}
		})
	}
}

// FuzzServiceName: for any two ids (and the ids built to collide with
// them), every name is a valid DNS-1035 label, kept names are the old
// controller's, and distinct ids share a name only when both are hashed
// the same way with colliding hashes. Our DNS-1035 check agrees with
// apimachinery's.
func FuzzServiceName(f *testing.F) {
	seeds := [][2]string{
		{"", "a"}, {"Node_7", "node-7"}, {"trailing-", "trailing"}, {"hôte-ümlaüt-0001", "h-te-mla-t-0"},
		{longSwitchID, legacyID(longSwitchID)}, {"---", ""}, {"ÀÉÎ", "aei"}, {"abcdefghijk-xyz", "abcdefghijk-"},
		{"ABC", "abc-" + hash8("ABC")}, {"Abcd", "abcd-" + hash16("Abcd")}, {"host-abcd-12", "host-abcd-123"},
		{"host-rack-01-f3zlaaa", "host-rack-01-0papaaa"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], false)
	}
	f.Fuzz(func(t *testing.T, a, b string, dpu bool) {
		typ, other := MachineTypeHost, MachineTypeDPU
		if dpu {
			typ, other = other, typ
		}
		for _, id := range []string{a, b} {
			old := namePrefix(typ) + legacyID(id)
			if valid := len(validation.IsDNS1035Label(old)) == 0; isDNS1035Label(old) != valid {
				t.Fatalf("isDNS1035Label(%q) = %v, apimachinery says %v", old, !valid, valid)
			}
			if ServiceName(typ, id) == ServiceName(other, id) {
				t.Fatalf("host and dpu names of %q are equal", id)
			}
		}
		ids := append(adversaries(a), adversaries(b)...)
		names := make([]string, len(ids))
		for i, id := range ids {
			names[i] = checkName(t, typ, id)
		}
		for i := range ids {
			for j := i + 1; j < len(ids); j++ {
				if ids[i] != ids[j] && names[i] == names[j] && !nameCollisionAllowed(typ, ids[i], ids[j]) {
					t.Fatalf("ids %q and %q share the name %q", ids[i], ids[j], names[i])
				}
			}
		}
	})
}

// FuzzLabelValue: for any two inputs (and the inputs built to collide with
// them), every value is valid, kept values are the input, and distinct
// inputs share a value only when both are hashed with colliding hashes.
// Our validity check agrees with apimachinery's.
func FuzzLabelValue(f *testing.F) {
	seeds := [][2]string{
		{"", "h"}, {"a", "A"}, {"trailing-", "trailing-a66d02a8"}, {"-x-", "x"}, {"hôte-ümlaüt-0001", "h-te-mla-t-0001"},
		{longSwitchID, longSwitchID[:63]}, {"a..b", "a-b"}, {"A_b.C", "a_b.c"}, {strings.Repeat("x.", 40), "x"},
		{"node_0123456789abcdef", "node"}, {"___", "h_" + hash16("___")},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		for _, s := range []string{a, b} {
			if valid := len(validation.IsValidLabelValue(s)) == 0; isLabelValue(s) != valid {
				t.Fatalf("isLabelValue(%q) = %v, apimachinery says %v", s, !valid, valid)
			}
			if v, again := LabelValue(s), LabelValue(strings.Clone(s)); v != again {
				t.Fatalf("LabelValue(%q) not stable: %q, then %q", s, v, again)
			}
		}
		ins := append(adversaries(a), adversaries(b)...)
		vals := make([]string, len(ins))
		for i, s := range ins {
			vals[i] = checkLabel(t, s)
		}
		for i := range ins {
			for j := i + 1; j < len(ins); j++ {
				if ins[i] != ins[j] && vals[i] == vals[j] && !labelCollisionAllowed(ins[i], ins[j]) {
					t.Fatalf("inputs %q and %q share the label value %q", ins[i], ins[j], vals[i])
				}
			}
		}
	})
}
