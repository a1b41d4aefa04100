package operator

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestCheckNATSUnparsableURLSecret: check's NATS row never shows the
// password of a URL net/url rejects, neither in the URL nor in the parse
// error (nor the bad escape it quotes).
func TestCheckNATSUnparsableURLSecret(t *testing.T) {
	for _, u := range []string{"nats://bob:s3cret PW@127.0.0.1:1", "nats://bob:s3%zzcret@127.0.0.1:1"} {
		rows := Check(context.Background(), CheckConfig{NATSURL: u,
			ConnectNATS: func() (*nats.Conn, error) { return nats.Connect(u) },
			KubeErr:     errors.New("no kube")})
		if len(rows) == 0 || rows[0].Name != "NATS" || rows[0].Result != CheckFail {
			t.Fatalf("rows: %+v", rows)
		}
		for _, r := range rows {
			if strings.Contains(r.Detail, "s3") || strings.Contains(r.Detail, "zz") {
				t.Fatalf("secret in %s row: %s", r.Name, r.Detail)
			}
		}
		if !strings.Contains(rows[0].Detail, `"nats://***@127.0.0.1:1"`) {
			t.Fatalf("NATS row: %s", rows[0].Detail)
		}
	}
}

// TestSourceNamesSecret: the sources API's errors name its URL without
// user info, parsable or not.
func TestSourceNamesSecret(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, base := range []string{"http://u:pw9x@" + host, "http://u:pw 9x@" + host, "http://u:pw%zz9x@" + host, "http://tok9x@" + host} {
		_, err := sourceNames(context.Background(), nil, base)
		if err == nil || strings.Contains(err.Error(), "9x") || strings.Contains(err.Error(), "zz") || !strings.Contains(err.Error(), "***@"+host) {
			t.Fatalf("sourceNames(%q): %v", base, err)
		}
	}
}
