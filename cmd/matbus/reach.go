package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/client-go/kubernetes"

	"github.com/matbus/matbus/internal/redact"
)

// reachWait is how long the one-shot commands (status, errors, plan) wait
// for NATS or the Kubernetes API server before they give up and say why:
// long enough for a server that is starting, short enough that a wrong
// address is reported while the user still looks.
const reachWait = 5 * time.Second

// connectReachable connects like n.connect and waits up to wait for the
// connection. When none is made by then, it closes the connection and
// returns an error naming the address and the cause (the last connect error,
// or what a plain TCP dial of the first server says: connection refused, no
// such host, a timeout). Credentials in the URL are never shown.
func connectReachable(ctx context.Context, n *natsOpts, name string, log *slog.Logger, wait time.Duration) (*nats.Conn, error) {
	nc, err := n.connect(name, log)
	if err != nil {
		return nil, err
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !nc.IsConnected() {
		select {
		case <-ctx.Done():
			nc.Close()
			return nil, ctx.Err()
		case <-deadline.C:
			cause := nc.LastError()
			nc.Close()
			if cause == nil || errors.Is(cause, nats.ErrNoServers) {
				cause = dialCause(ctx, n.url)
			}
			return nil, fmt.Errorf("NATS at %s is not reachable (waited %s): %v", redact.StripUserInfo(n.url), wait, cause)
		case <-tick.C:
		}
	}
	return nc, nil
}

// dialCause dials the first server of a --nats-url list over TCP (2 s at
// most) and returns why that fails, or a plain note when it does not (then
// the server accepts TCP but not the NATS handshake: TLS or credentials).
func dialCause(ctx context.Context, urls string) error {
	first := strings.TrimSpace(strings.Split(urls, ",")[0])
	u, err := url.Parse(first)
	if err != nil || u.Host == "" {
		return errors.New("no server address in --nats-url")
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(dctx, "tcp", host)
	if err != nil {
		return err
	}
	_ = c.Close()
	return errors.New("the server accepts TCP connections but no NATS connection was made (TLS or credentials? see --nats-tls-ca, --nats-creds)")
}

// kubeReachable asks the API server for /version (any authenticated client
// may read it) within wait and returns nil, or an error naming the server
// and the cause.
func kubeReachable(ctx context.Context, kube kubernetes.Interface, host string, wait time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := kube.Discovery().RESTClient().Get().AbsPath("/version").Do(rctx).Error()
	if err == nil {
		return nil
	}
	if rctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("the Kubernetes API server at %s is not reachable (no answer in %s): %w", host, wait, err)
	}
	return fmt.Errorf("the Kubernetes API server at %s is not reachable: %w", host, err)
}
