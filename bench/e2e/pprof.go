package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// profileDelay is how long after a phase's start the API server's CPU
// profile of length d begins (3 s, or d/4 for a profile shorter than 12 s):
// the first requests' connection set-up stays out of it.
func profileDelay(d time.Duration) time.Duration { return min(3*time.Second, d/4) }

// profile saves a CPU profile of kube-apiserver (its /debug/pprof/profile,
// served because kubelocal leaves --profiling at its default, on) taken
// over --pprof-seconds, starting profileDelay after now, to
// --pprof-dir/<name>.pprof. It returns at once; wait blocks until the
// profile is written (or failed, which is logged). Without --pprof-dir it
// does nothing. A phase that ends before the profile does leaves idle
// time in it: compare the profiles' total samples.
func (b *bench) profile(ctx context.Context, name string) (wait func()) {
	if b.cfg.PprofDir == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-time.After(profileDelay(b.cfg.PprofLength)):
		}
		secs := int(b.cfg.PprofLength.Seconds())
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.PprofLength+30*time.Second)
		defer cancel()
		body, err := b.raw.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(secs)).DoRaw(pctx)
		if err != nil {
			b.logf("pprof %s: %v", name, err)
			return
		}
		path := filepath.Join(b.cfg.PprofDir, profileFile(name))
		if err := os.WriteFile(path, body, 0o644); err != nil {
			b.logf("pprof %s: %v", name, err)
			return
		}
		b.logf("pprof: kube-apiserver CPU profile over %ds saved to %s", secs, path)
	}()
	return func() { <-done }
}

// profileFile is the file name of profile name: "r1 w=3 converge" →
// "kube-apiserver-r1-w3-converge.pprof".
func profileFile(name string) string {
	r := strings.NewReplacer(" ", "-", "=", "", ",", "", "/", "-")
	return fmt.Sprintf("kube-apiserver-%s.pprof", r.Replace(name))
}
