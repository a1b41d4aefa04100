package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/matbus/matbus/internal/cliflag"
)

// runProbe is a healthcheck for images without curl or wget: GET --url and
// exit 0 on a 2xx answer, 1 otherwise.
func runProbe(ctx context.Context, args []string, e env) error {
	fs := cliflag.NewFlagSet("probe", "GET a URL and exit 0 on a 2xx answer (a healthcheck for containers without curl).")
	var url string
	var insecure bool
	var timeout time.Duration
	fs.StringVar(&url, "url", "http://127.0.0.1:8080/readyz", "URL to GET")
	fs.BoolVar(&insecure, "insecure-skip-verify", false, "do not verify the server's TLS certificate")
	cliflag.DurationVar(fs, &timeout, "timeout", 3*time.Second, "timeout of the request")
	if err := cliflag.Parse(fs, args, e.lookupEnv); err != nil {
		return usageErr(err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("%w: --url: %v", errUsage, err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: insecure}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe %s: %s", url, resp.Status)
	}
	fmt.Fprintln(e.stdout, resp.Status)
	return nil
}
