package redact

import (
	"flag"
	"net/url"
	"os"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
)

// inClusterTokenFile is where rest.InClusterConfig reads the service account token.
const inClusterTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// FlagSecrets returns the secrets that the parsed flags of fs lead to: the
// password or token in --nats-url (and --sources-url), parsable or not, the JWT and seed in the --nats-creds
// file, the contents of the --nats-tls-key file, the tokens and passwords of the --kubeconfig file (and of the token
// files it names) or, without --kubeconfig, the in-cluster service account
// token. A flag fs lacks, or a file that cannot be read, adds nothing (the
// command reports an unreadable file when it uses it).
func FlagSecrets(fs *flag.FlagSet) []string {
	val := func(name string) (string, bool) {
		f := fs.Lookup(name)
		if f == nil {
			return "", false
		}
		return f.Value.String(), true
	}
	var out []string
	if v, ok := val("nats-url"); ok {
		out = append(out, urlSecrets(v)...)
	}
	if v, ok := val("sources-url"); ok {
		out = append(out, urlSecrets(v)...)
	}
	if v, ok := val("nats-creds"); ok && v != "" {
		out = append(out, credsSecrets(v)...)
	}
	if v, ok := val("kubeconfig"); ok {
		out = append(out, kubeSecrets(v)...)
	}
	if v, ok := val("nats-tls-key"); ok && v != "" {
		out = append(out, keySecrets(v)...)
	}
	return out
}

// keySecrets returns the base64 lines of the PEM private key file at path
// (the --nats-tls-key file), each of which must never be logged; the
// path itself is no secret.
func keySecrets(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if len(line) >= 16 && !strings.HasPrefix(line, "-----") && !strings.Contains(line, ":") {
			out = append(out, line)
		}
	}
	return out
}

// urlSecrets returns the password (or, without one, the token: the user
// name) of each URL in a comma-separated list, as written and unescaped,
// also of a URL net/url cannot parse (a space or bad escape in the
// password): the text between "://" (and the user name's ':') and the last '@'.
func urlSecrets(list string) []string {
	var out []string
	for _, u := range strings.Split(list, ",") {
		u = strings.TrimSpace(u)
		_, rest, ok := strings.Cut(u, "://")
		if !ok {
			continue
		}
		// A URL net/url rejects may hold '/', '?' or '#' in its password:
		// its user info ends at its last '@'.
		if _, err := url.Parse(u); err == nil || strings.LastIndexByte(rest, '@') < 0 {
			if i := strings.IndexAny(rest, "/?#"); i >= 0 {
				rest = rest[:i]
			}
		}
		at := strings.LastIndexByte(rest, '@')
		if at <= 0 {
			continue
		}
		secret := rest[:at]
		if _, pw, ok := strings.Cut(secret, ":"); ok {
			secret = pw
		}
		out = append(out, secret)
		if un, err := url.PathUnescape(secret); err == nil && un != secret {
			out = append(out, un)
		}
	}
	return out
}

// credsSecrets returns the user JWT and NKEY seed of a NATS .creds file.
func credsSecrets(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range decoratedRE.FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

// kubeSecrets returns the bearer tokens, passwords and token-file contents
// of every user in the kubeconfig at path, and the token values of their
// auth-provider settings; for path "" the in-cluster token.
func kubeSecrets(path string) []string {
	readFile := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	if path == "" {
		return []string{readFile(inClusterTokenFile)}
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, ai := range cfg.AuthInfos {
		out = append(out, ai.Token, ai.Password)
		if ai.TokenFile != "" {
			out = append(out, readFile(ai.TokenFile))
		}
		if ai.AuthProvider != nil {
			for k, v := range ai.AuthProvider.Config {
				if k = strings.ToLower(k); strings.Contains(k, "token") || strings.Contains(k, "secret") || strings.Contains(k, "password") {
					out = append(out, v)
				}
			}
		}
	}
	return out
}
