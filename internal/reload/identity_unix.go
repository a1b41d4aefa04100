//go:build unix

package reload

import (
	"os"
	"syscall"
)

// devIno returns the device and inode of fi (0, 0 when unknown).
func devIno(fi os.FileInfo) (dev, ino uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), uint64(st.Ino) //nolint:unconvert // their types differ between platforms
	}
	return 0, 0
}
