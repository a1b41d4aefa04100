package main

import (
	"strings"
	"testing"
)

// TestUnparsableURLSecrets: a password that net/url rejects (a space, a bad
// escape) never shows in the output of worker, status, errors or check,
// neither in the URL nor in a quoted parse error; the flag's usage error
// names the URL without its user info.
func TestUnparsableURLSecrets(t *testing.T) {
	cases := []struct {
		name, url string
		secrets   []string
	}{
		{"space", "nats://bob:s3cret PW@127.0.0.1:1", []string{"s3cret", "PW@"}},
		{"bad escape", "nats://bob:s3%zzcret@127.0.0.1:1", []string{"s3%zz", "zzcret", `"%zz"`}},
		{"bad escape and space", "nats://bob:pa%zz w0rd@127.0.0.1:1", []string{"pa%zz", "w0rd", `"%zz"`}},
		{"slash in password", "nats://bob:pa/ss@127.0.0.1:1", []string{"pa/ss", ":pa"}},
		{"second of a list", "nats://127.0.0.1:1, nats://bob:s3cret PW@127.0.0.1:2", []string{"s3cret", "PW@"}},
	}
	cmds := map[string][]string{
		"worker": {"--health-addr", "", "--kubeconfig", ""},
		"status": {"--timeout", "2s"},
		"errors": {"--since", "1h", "--follow=false"},
		"check":  {"--timeout", "2s"},
	}
	for _, c := range cases {
		for cmd, extra := range cmds {
			t.Run(c.name+"/"+cmd, func(t *testing.T) {
				args := append([]string{cmd, "--nats-url", c.url}, extra...)
				code, out, errOut := runArgs(t, nil, args...)
				all := out + errOut
				for _, s := range c.secrets {
					if strings.Contains(all, s) {
						t.Fatalf("%q shown (exit %d):\n%s", s, code, all)
					}
				}
				if code != 2 || !strings.Contains(errOut, "invalid --nats-url") || !strings.Contains(errOut, "***@127.0.0.1:") {
					t.Fatalf("exit %d, want 2 and the redacted URL:\n%s", code, all)
				}
			})
		}
	}
	// The same from the environment.
	code, out, errOut := runArgs(t, map[string]string{"MATBUS_NATS_URL": "nats://bob:s3cret PW@127.0.0.1:1"}, "errors", "--since", "1h", "--follow=false")
	if code != 2 || strings.Contains(out+errOut, "s3cret") {
		t.Fatalf("from the environment: exit %d:\n%s%s", code, out, errOut)
	}

	for _, u := range []string{"http://u:pw 9@127.0.0.1:1", "http://u:pw%zz9@127.0.0.1:1"} {
		code, out, errOut := runArgs(t, nil, "status", "--nats-url", "nats://127.0.0.1:1", "--sources-url", u, "--timeout", "2s")
		if all := out + errOut; code != 2 || strings.Contains(all, "pw") || strings.Contains(all, "zz9") ||
			!strings.Contains(errOut, `invalid --sources-url "http://***@127.0.0.1:1"`) {
			t.Fatalf("status --sources-url %q: exit %d:\n%s", u, code, all)
		}
	}
}

// TestSchemelessURLSecrets: a --nats-url without "nats://" or "tls://" is a
// usage error that quotes the value without its user info, whichever
// subcommand reads it, from the flag or the environment.
func TestSchemelessURLSecrets(t *testing.T) {
	urls := []string{"u:S3cretPW@127.0.0.1:4223", "//u:S3cretPW@127.0.0.1:4223", "nats:/u:S3cretPW@127.0.0.1:4223",
		"nats://127.0.0.1:1,u:S3cretPW@127.0.0.1:4223"}
	cmds := map[string][]string{
		"worker":    {"--health-addr", "", "--kubeconfig", ""},
		"discovery": {"--health-addr", "", "--static", "a=https://h:1", "--leader-elect=false"},
		"status":    {"--timeout", "2s"},
		"errors":    {"--since", "1h", "--follow=false"},
		"check":     {"--timeout", "2s"},
	}
	for _, u := range urls {
		for cmd, extra := range cmds {
			code, out, errOut := runArgs(t, nil, append([]string{cmd, "--nats-url", u}, extra...)...)
			if all := out + errOut; code != 2 || strings.Contains(all, "S3cret") || !strings.Contains(errOut, "***@127.0.0.1:4223") {
				t.Errorf("%s --nats-url %q: exit %d, want 2 and the value without its password:\n%s", cmd, u, code, all)
			}
		}
		code, out, errOut := runArgs(t, map[string]string{"MATBUS_NATS_URL": u}, "errors", "--since", "1h", "--follow=false")
		if all := out + errOut; code != 2 || strings.Contains(all, "S3cret") {
			t.Errorf("MATBUS_NATS_URL=%q: exit %d:\n%s", u, code, all)
		}
	}
}
