package matclient

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// sharedFixtures is the project's shared fixture folder, relative to this
// package's directory (/work/main/matclient -> /work/shared/...). It is
// only an extra source of seeds: testdata/ holds copies of every fixture.
var sharedFixtures = filepath.Join("..", "..", "shared", "fixtures", "mat-status")

func fuzzSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, dir := range []string{"testdata", sharedFixtures} {
		for _, pattern := range []string{"*.json", filepath.Join("malformed", "*.json")} {
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
		// Decoding is deterministic.
		st2, err := Decode(body)
		if err != nil || st2.Counts() != st.Counts() {
			t.Fatalf("second decode differs: %v", err)
		}
	})
}
