package natsconn

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// TestValidate names the flag and never shows a URL's user info.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{URL: "nats://127.0.0.1:4222, tls://h:4222"}, ""},
		{Config{URL: "http://127.0.0.1:4222"}, "want nats://host:port or tls://host:port"},
		{Config{URL: "nats://u:s3cret@h:4222", TLSCert: "c.pem"}, "--nats-tls-cert and --nats-tls-key go together"},
		{Config{URL: "nats://u:s3cr%zz@h:4222"}, "invalid --nats-url"},
	} {
		err := tc.c.Validate()
		switch {
		case tc.want == "" && err != nil, tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "s3cr"):
			t.Errorf("%+v: the error shows the password: %v", tc.c, err)
		}
	}
}

// TestCredsFile: a whole .creds file is taken; a half-written one, or one
// whose seed is not the JWT's user, is refused without quoting it.
func TestCredsFile(t *testing.T) {
	okp, _ := nkeys.CreateAccount()
	upub := func(kp nkeys.KeyPair) string { p, _ := kp.PublicKey(); return p }
	user, _ := nkeys.CreateUser()
	other, _ := nkeys.CreateUser()
	claims := jwt.NewUserClaims(upub(user))
	token, err := claims.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	otherSeed, _ := other.Seed()
	whole, _ := jwt.FormatUserConfig(token, seed)
	wrong, _ := jwt.FormatUserConfig(token, otherSeed)
	if c, err := parseNATSCreds(whole); err != nil || c.jwt != token {
		t.Fatalf("whole file: %v", err)
	}
	for name, data := range map[string][]byte{"half": whole[:len(whole)/2], "wrong seed": wrong} {
		_, err := parseNATSCreds(data)
		if err == nil || strings.Contains(err.Error(), string(seed)) {
			t.Errorf("%s: %v", name, err)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "u.creds")
	if err := os.WriteFile(path, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	if opts, err := (Config{URL: "nats://127.0.0.1:1", Creds: path}).FileOptions(nil); err != nil || len(opts) != 1 {
		t.Errorf("FileOptions: %d options, %v", len(opts), err)
	}
	if _, err := (Config{Creds: filepath.Join(dir, "missing")}).FileOptions(nil); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing creds file: %v", err)
	}
}
