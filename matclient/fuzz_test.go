package matclient

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
)

// sharedFixtures is the project's shared fixture folder, relative to this
// package's directory (/work/main/matclient -> /work/shared/...). It is
// only an extra source of seeds: testdata/ holds copies of every fixture.
var sharedFixtures = filepath.Join("..", "..", "shared", "fixtures", "mat-status")

func fuzzSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, dir := range []string{"testdata", sharedFixtures} {
		for _, pattern := range []string{"*.json", filepath.Join("malformed", "*.json"), filepath.Join("partial", "*.json")} {
			files, err := filepath.Glob(filepath.Join(dir, pattern))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					continue // a missing or unreadable seed is skipped
				}
				seeds = append(seeds, b)
			}
		}
	}
	return seeds
}

func TestFuzzSeedsFound(t *testing.T) {
	// 5 fixtures + 9 malformed in testdata at least.
	if n := len(fuzzSeeds(t)); n < 14 {
		t.Errorf("found %d seeds, want >= 14", n)
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte(`{"machines":[{"mat_id":"a","bmc":{"redfish":{"reachable_port":443,"listen_port":1266}},"dpus":[{"mat_id":"b","bmc":{"redfish":{"reachable_port":1,"listen_port":65535}}}]}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, body []byte) {
		st, err := Decode(body)
		if err != nil {
			if st != nil {
				t.Fatalf("status and error both returned")
			}
			if !errors.Is(err, ErrInvalidStatus) {
				t.Fatalf("error %v does not wrap ErrInvalidStatus", err)
			}
			return
		}
		if err := st.Validate(); err != nil {
			t.Fatalf("Decode accepted a status that fails Validate: %v\nbody: %q", err, body)
		}
		// Legacy kinds must follow the hardware-type rule.
		if st.Schema == SchemaLegacy {
			for i := range st.Machines {
				d := &st.Machines[i]
				if d.Kind != KindForHardwareType(d.HardwareType) {
					t.Fatalf("legacy %s kind %q for hardware %q", d.MatID, d.Kind, d.HardwareType)
				}
			}
		}
		checkConservation(t, body, st)
		// Decoding is deterministic.
		st2, err := Decode(body)
		if err != nil || !reflect.DeepEqual(st, st2) {
			t.Fatalf("second decode differs: %v", err)
		}
	})
}

// checkConservation: every device of the body is either kept or listed in
// Invalid: each top-level item is a kept machine or an Invalid entry
// "machines[i]", and each DPU item of a kept host is a kept DPU or an
// Invalid entry "machines[i].dpus[j]".
func checkConservation(t *testing.T, body []byte, st *Status) {
	t.Helper()
	var top struct {
		Machines []json.RawMessage `json:"machines"`
	}
	if err := json.Unmarshal(body, &top); err != nil {
		t.Fatalf("Decode accepted a body encoding/json rejects: %v", err)
	}
	listed := make(map[string]bool, len(st.Invalid))
	for _, inv := range st.Invalid {
		listed[inv.Path] = true
	}
	kept := 0
	for i, raw := range top.Machines {
		pos := "machines[" + strconv.Itoa(i) + "]"
		if listed[pos] {
			continue
		}
		if kept >= len(st.Machines) {
			t.Fatalf("%s neither kept nor listed", pos)
		}
		host := &st.Machines[kept]
		kept++
		var dev struct {
			DPUs json.RawMessage `json:"dpus"` // raw: the last of duplicate keys wins, as in Decode
		}
		var dpus []json.RawMessage
		if err := json.Unmarshal(raw, &dev); err != nil {
			t.Fatalf("%s (kept as %s): %v", pos, host.MatID, err)
		}
		if jsonType(dev.DPUs) == "array" {
			if err := json.Unmarshal(dev.DPUs, &dpus); err != nil {
				t.Fatalf("%s (kept as %s): dpus: %v", pos, host.MatID, err)
			}
		}
		n := 0
		for j := range dpus {
			if !listed[pos+".dpus["+strconv.Itoa(j)+"]"] {
				n++
			}
		}
		if n != len(host.DPUs) {
			t.Fatalf("%s (%s): %d dpus in the body not listed as invalid, %d kept", pos, host.MatID, n, len(host.DPUs))
		}
	}
	if kept != len(st.Machines) {
		t.Fatalf("%d machines kept, %d accounted for in the body", len(st.Machines), kept)
	}
}
