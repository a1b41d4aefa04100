// Command reachprobe is the kube-e2e scenario's prober: run in a pod, it
// connects to every TCP address it is given, each on its own interval, and
// prints each address's changes of reachability, one line each, for the
// test to read from the pod's log:
//
//	up <addr> <unix ms>                         first reachable
//	down <addr> <unix ms> <error>               the first failed connect after a success
//	window <addr> <from ms> <to ms> <failures>  back: from the end of the last
//	                                            success to the start of the
//	                                            first one after
//
// It is built static by the test (CGO_ENABLED=0) and mounted into a pod of
// any image from the node: no registry is reachable there. It never ends
// by itself; SIGTERM stops it.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func main() {
	interval := flag.Duration("interval", 150*time.Millisecond, "time between two connects to one address")
	timeout := flag.Duration("timeout", 300*time.Millisecond, "timeout of one connect")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: reachprobe [-interval d] [-timeout d] host:port...")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	var wg sync.WaitGroup
	for _, addr := range flag.Args() {
		wg.Go(func() { probe(ctx, addr, *interval, *timeout, say) })
	}
	wg.Wait()
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// probe connects to addr every interval until ctx ends and reports its
// changes through say.
func probe(ctx context.Context, addr string, interval, timeout time.Duration, say func(string, ...any)) {
	d := net.Dialer{Timeout: timeout}
	var seen, up bool
	var lastOK time.Time // end of the last successful connect
	failures := 0
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		start := time.Now()
		c, err := d.DialContext(ctx, "tcp", addr)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			c.Close()
			switch {
			case !seen:
				say("up %s %d", addr, ms(start))
			case !up:
				say("window %s %d %d %d", addr, ms(lastOK), ms(start), failures)
			}
			seen, up, failures = true, true, 0
			lastOK = time.Now()
		} else if seen {
			if up {
				say("down %s %d %q", addr, ms(start), err.Error())
			}
			up = false
			failures++
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
