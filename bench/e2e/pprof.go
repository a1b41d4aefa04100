package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// profileDelay is how long after a phase's start the CPU profiles of
// length d begin (3 s, or d/4 for a profile shorter than 12 s): the first
// requests' connection set-up stays out of them.
func profileDelay(d time.Duration) time.Duration { return min(3*time.Second, d/4) }

// pprofDelay is --pprof-delay, or profileDelay(--pprof-seconds) when it
// is not set.
func (b *bench) pprofDelay() time.Duration {
	if b.cfg.PprofDelay >= 0 {
		return b.cfg.PprofDelay
	}
	return profileDelay(b.cfg.PprofLength)
}

// profile saves CPU profiles taken over --pprof-seconds, starting
// --pprof-delay after now, to --pprof-dir: one of kube-apiserver (its
// /debug/pprof/profile, served because kubelocal leaves --profiling at its
// default, on), saved as kube-apiserver-<name>.pprof, and one of each of
// procs that serves /debug/pprof/ (discovery and workers run with --profiling,
// nats-server with --profile under --pprof-dir), saved as
// <proc>-<name>.pprof. All are taken over the same span. It returns at
// once; wait blocks until every profile is written (or failed, which is
// logged). Without --pprof-dir it does nothing. A phase that ends before
// the profiles do leaves idle time in them: compare total samples.
func (b *bench) profile(ctx context.Context, name string, procs ...*proc) (wait func()) {
	if b.cfg.PprofDir == "" {
		return func() {}
	}
	secs := int(b.cfg.PprofLength.Seconds())
	var wg sync.WaitGroup
	take := func(who string, fetch func(ctx context.Context) ([]byte, error)) {
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(b.pprofDelay()):
			}
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.PprofLength+30*time.Second)
			defer cancel()
			body, err := fetch(pctx)
			if err != nil {
				b.logf("pprof %s of %s: %v", name, who, err)
				return
			}
			path := filepath.Join(b.cfg.PprofDir, profileFile(who, name))
			if err := os.WriteFile(path, body, 0o644); err != nil {
				b.logf("pprof %s of %s: %v", name, who, err)
				return
			}
			b.logf("pprof: %s CPU profile over %ds saved to %s", who, secs, path)
		})
	}
	take("kube-apiserver", func(ctx context.Context) ([]byte, error) {
		return b.raw.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(secs)).DoRaw(ctx)
	})
	for _, p := range procs {
		if p == nil || p.pprof == "" {
			continue
		}
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.pprof, secs)
		take(p.name, func(ctx context.Context) ([]byte, error) { return httpGet(ctx, url) })
	}
	return wg.Wait
}

// httpGet returns the body (at most 64 MiB) of a 200 answer to GET url;
// any other status is an error carrying the start of the body.
func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	return body, nil
}

// profileFile is the file name of who's profile name: ("kube-apiserver",
// "r1 w=3 converge") → "kube-apiserver-r1-w3-converge.pprof".
func profileFile(who, name string) string {
	r := strings.NewReplacer(" ", "-", "=", "", ",", "", "/", "-")
	return fmt.Sprintf("%s-%s.pprof", r.Replace(who), r.Replace(name))
}
