package reload

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// CheckReadable returns nil when path can be opened for reading, else a file
// error (exit 1, not a usage error) that starts with label, e.g.
// "kubeconfig /x (--kubeconfig, KUBECONFIG)". For a permission problem the
// message names this process's uid and the file's owner and mode, and the
// usual cause: a file bind-mounted into a container from a checkout made
// under umask 077 (docker-compose.yaml mounts deploy/compose/ into
// containers that run as uid 65532).
func CheckReadable(label, path string) error {
	f, err := os.Open(path)
	if err == nil {
		f.Close()
		return nil
	}
	if !errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%s is not usable: %w", label, err)
	}
	msg := fmt.Sprintf("%s is not readable by this process (uid %d, gid %d)", label, os.Getuid(), os.Getgid())
	if fi, serr := os.Stat(path); serr == nil {
		msg += fmt.Sprintf("; the file has mode %v", fi.Mode().Perm())
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			msg += fmt.Sprintf(", owner uid %d gid %d", st.Uid, st.Gid)
		}
	}
	msg += ". Make it readable by this user (e.g. `chmod a+r`); for docker compose: `chmod a+r deploy/compose/*` (a checkout made under umask 077 leaves them readable by their owner only)"
	return fmt.Errorf("%s: %w", msg, err)
}
