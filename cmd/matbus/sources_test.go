package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/matbus/matbus/discovery"
	"github.com/matbus/matbus/internal/natsserver"
)

// TestDiscoverySourcesAPI: `matbus discovery` serves its static instances
// (name without the namespace, URL as is) on --source-list-addr, and stops
// serving when it stops.
func TestDiscoverySourcesAPI(t *testing.T) {
	ns, err := natsserver.Start(natsserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"discovery", "--nats-url", ns.ClientURL(), "--namespace", "mat",
			"--static", "mat-b=https://10.0.0.2:1266,mat-a=https://10.0.0.1:1266", "--leader-elect=false",
			"--health-addr", "", "--source-list-addr", addr, "--source-list-debounce", "0s"}, envT(&out, &errOut, nil))
	}()
	url := "http://" + addr + discovery.SourcesPath
	var got discovery.Sources
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
		}
		if err == nil && got.Ready {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("sources API not ready: %v %+v\n%s", err, got, errOut.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := []discovery.SourceEntry{{Name: "mat-a", BaseURL: "https://10.0.0.1:1266"}, {Name: "mat-b", BaseURL: "https://10.0.0.2:1266"}}
	if got.Generation != 1 || len(got.List) != 2 || got.List[0] != want[0] || got.List[1] != want[1] {
		t.Errorf("served %+v, want generation 1 and %+v", got, want)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d\n%s", code, errOut.String())
	}
	if _, err := http.Get(url); err == nil {
		t.Error("sources API still served after discovery stopped")
	}
}
