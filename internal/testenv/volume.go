package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Volume is a folder laid out as kubelet lays out a mounted Secret or
// ConfigMap: the files live in a timestamped folder `..<time>`, the link
// `..data` points to it, and each visible name is a link `<name> →
// ..data/<name>`. Update swaps the contents as kubelet's atomic writer
// does: a new timestamped folder, a link `..data_tmp` to it renamed over
// `..data` (one atomic rename), the old folder removed.
type Volume struct {
	t   testing.TB
	Dir string
	n   int
	cur string // current timestamped folder
}

// NewVolume makes a Volume in a fresh temporary folder holding files
// (name → contents).
func NewVolume(t testing.TB, files map[string][]byte) *Volume {
	t.Helper()
	v := &Volume{t: t, Dir: t.TempDir()}
	v.Update(files)
	return v
}

// Path returns the visible path of name (what a process is given).
func (v *Volume) Path(name string) string { return filepath.Join(v.Dir, name) }

// Update replaces the volume's contents with files in one atomic swap of
// `..data`.
func (v *Volume) Update(files map[string][]byte) {
	v.t.Helper()
	v.n++
	ts := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), v.n)
	if err := os.Mkdir(filepath.Join(v.Dir, ts), 0o755); err != nil {
		v.t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(v.Dir, ts, name), data, 0o600); err != nil {
			v.t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.Dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(v.Dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				v.t.Fatal(err)
			}
		}
	}
	if v.cur != "" {
		if err := os.RemoveAll(filepath.Join(v.Dir, v.cur)); err != nil {
			v.t.Fatal(err)
		}
	}
	v.cur = ts
}

// Unlink removes the current timestamped folder's file name, as if it
// were briefly missing in the middle of an update (the visible link then
// dangles).
func (v *Volume) Unlink(name string) {
	v.t.Helper()
	if err := os.Remove(filepath.Join(v.Dir, v.cur, name)); err != nil {
		v.t.Fatal(err)
	}
}

// WriteInPlace writes data into the current file name as an editor or cp
// would (truncate and write, same inode), without a swap: half a file is
// a file caught in the middle of such a write.
func (v *Volume) WriteInPlace(name string, data []byte) {
	v.t.Helper()
	if err := os.WriteFile(filepath.Join(v.Dir, v.cur, name), data, 0o600); err != nil {
		v.t.Fatal(err)
	}
}
