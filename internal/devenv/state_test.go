package devenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// TestStaleDevStateRemoved: the state folder of a process that is gone is
// removed; those of a running process or without an owner are kept.
func TestStaleDevStateRemoved(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := cmd.Process.Pid // reaped: no such process any more
	mk := func(name, owner string) string {
		d := filepath.Join(tmp, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(d, devStateOwner), []byte(owner), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	killed := mk(devStatePrefix+"killed", strconv.Itoa(dead))
	running := mk(devStatePrefix+"running", "1") // init runs
	noOwner := mk(devStatePrefix+"noowner", "")
	other := mk("matbus-kube-other", strconv.Itoa(dead))
	mine, remove, err := newDevState(tmp)
	if err != nil {
		t.Fatal(err)
	}
	removed, err := removeStaleDevState(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{killed}) {
		t.Errorf("removed %v, want only %s", removed, killed)
	}
	for _, d := range []string{running, noOwner, other, mine} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	remove()
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Errorf("own state folder not removed: %v", err)
	}
}
