package main

import (
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestKubeCompression: by default the Kubernetes client does not ask for
// gzip (Go's transport would add "Accept-Encoding: gzip" on its own, and
// the API server then compresses every watch event); --kube-compression
// asks for it again. The header is read by a server, not from the config.
func TestKubeCompression(t *testing.T) {
	var mu sync.Mutex
	var got []string
	// TLS as a real API server: client-go builds its own transport (which
	// carries the setting) only for TLS; plain HTTP gets Go's default one.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Accept-Encoding"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"Service","apiVersion":"v1","metadata":{"name":"s","namespace":"ns"}}`)
	}))
	defer srv.Close()

	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--kube-compression"}, "gzip"},
		{[]string{"--kube-compression=false"}, ""},
	} {
		var o kubeOpts
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		o.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
		o.apply(cfg)
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kc.CoreV1().Services("ns").Get(context.Background(), "s", metav1.GetOptions{}); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		mu.Lock()
		last := got[len(got)-1]
		mu.Unlock()
		if last != tc.want {
			t.Errorf("%v: Accept-Encoding %q, want %q", tc.args, last, tc.want)
		}
	}
}
