// Command pause is the sandbox (infra) container of every pod on the
// kube-e2e node (hack/kube-e2e.sh): it holds the pod's namespaces open. As
// PID 1 of the pod it reaps orphaned children and exits 0 on SIGINT or
// SIGTERM. Built static (CGO_ENABLED=0) into the local pause image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
