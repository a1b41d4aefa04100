// Command gatewaystandin stands in for the MAT protocol gateway in the
// discovery pod of `make kube-e2e` (hack/kube-e2e.sh builds it into an
// image; docs/adr/0032-gateway-sidecar.md). It reads the gateway.toml the
// chart renders, serves HTTPS with its certificate on its listen address,
// and polls its [sources] url with the gateway's exit rules
// (internal/testenv.Gateway): exit 3 when the set of sources changes, exit 1
// when no ready document with a source comes within the start-up budget.
// It is a test tool: it never forwards a MAT protocol message.
package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/matbus/matbus/internal/testenv"
)

func main() {
	config := flag.String("config", "/etc/mat-gateway/config/gateway.toml", "the gateway.toml the chart renders")
	every := flag.Duration("poll-interval", 2*time.Second, "time between two GETs of the sources API (the gateway's: 2s)")
	startPolls := flag.Int("start-polls", 150, "polls without a ready document with a source before exit 1 (the gateway's: 150)")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	code, err := run(log, *config, *every, *startPolls)
	if err != nil {
		log.Error("gateway stand-in", "err", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func run(log *slog.Logger, path string, every time.Duration, startPolls int) (int, error) {
	cfg, err := readConfig(path)
	if err != nil {
		return 0, err
	}
	url := cfg["sources.url"]
	if url == "" {
		return 0, fmt.Errorf("%s: no [sources] url", path)
	}
	if ca := cfg["sources.ca_cert_path"]; ca != "" {
		// The chart serves the sources API as plain HTTP on loopback; a CA
		// here would mean the rendering and discovery disagree.
		return 0, fmt.Errorf("%s: [sources] ca_cert_path %q: the stand-in reads plain HTTP only", path, ca)
	}
	if dir := cfg["auth.secret_dir"]; dir != "" {
		if _, err := os.ReadDir(dir); err != nil {
			return 0, fmt.Errorf("%s: [auth] secret_dir: %w", path, err)
		}
	}
	srv, err := serve(log, cfg)
	if err != nil {
		return 0, err
	}
	defer srv.Close()

	g := testenv.RunGateway(url, every, startPolls)
	defer g.Stop()
	log.Info("polling the sources API", "url", url, "every", every, "start_polls", startPolls)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	logged := false
	for {
		select {
		case s := <-sig:
			log.Info("stopping", "signal", s.String(), "set", g.Set())
			return 0, nil
		case <-g.Done():
			code, reason, _ := g.Exit()
			log.Warn("exit", "code", code, "reason", reason)
			return code, nil
		case <-tick.C:
			if set := g.Set(); set != nil && !logged {
				logged = true
				log.Info("sources taken", "set", set, "polls", g.Polls())
			}
		}
	}
}

// serve answers GET /healthz on the listen address with the configured
// certificate, so that the Service, the port and the TLS Secret of the
// chart are exercised.
func serve(log *slog.Logger, cfg map[string]string) (*http.Server, error) {
	host, port := cfg["server.listen_ip_address"], cfg["server.port"]
	if host == "" || port == "" {
		return nil, errors.New("no [server] listen_ip_address and port")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil, fmt.Errorf("[server] port %q: %w", port, err)
	}
	cert, err := tls.LoadX509KeyPair(cfg["tls.cert_path"], cfg["tls.key_path"])
	if err != nil {
		return nil, fmt.Errorf("[tls]: %w", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving", "err", err)
		}
	}()
	log.Info("serving HTTPS", "addr", ln.Addr().String())
	return srv, nil
}

// readConfig reads the subset of TOML the chart writes: [section] headers
// and `key = "string"` or `key = number` lines, as "section.key".
func readConfig(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.TrimSpace(line[1 : len(line)-1])
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return nil, fmt.Errorf("%s:%d: %q is not key = value", path, n, line)
			}
			v = strings.TrimSpace(v)
			if s, err := strconv.Unquote(v); err == nil {
				v = s
			}
			out[section+"."+strings.TrimSpace(k)] = v
		}
	}
	return out, sc.Err()
}
