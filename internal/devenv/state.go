package devenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// devStatePrefix names the temporary folders of `dev`'s local etcd and
// kube-apiserver; each holds devStateOwner, the owning process's id.
const (
	devStatePrefix = "matbus-dev-"
	devStateOwner  = "owner.pid"
)

// newDevState makes a temporary folder in tmp for the local control
// plane's data, certificates and logs, recording this process as its
// owner. remove deletes it.
func newDevState(tmp string) (dir string, remove func(), err error) {
	dir, err = os.MkdirTemp(tmp, devStatePrefix)
	if err != nil {
		return "", nil, fmt.Errorf("state folder: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, devStateOwner), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("state folder: %w", err)
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}

// removeStaleDevState removes the state folders in tmp whose owning
// process no longer runs (a `dev` killed with SIGKILL: nothing removed
// them; its etcd and kube-apiserver died with it) and returns them. Folders
// of running processes, and folders without an owner file, are left alone.
func removeStaleDevState(tmp string) ([]string, error) {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return nil, fmt.Errorf("look for stale state in %s: %w", tmp, err)
	}
	var removed []string
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), devStatePrefix) {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, devStateOwner))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || pid == os.Getpid() || alive(pid) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return removed, fmt.Errorf("remove stale state %s: %w", dir, err)
		}
		removed = append(removed, dir)
	}
	return removed, nil
}

// alive reports whether a process with id pid exists (EPERM: it exists,
// owned by another user).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
