package main

import "strings"

// kubeUserAgent is the User-Agent of a matbus process's Kubernetes
// requests: "matbus/<version> (<subcommand>; <instance>[; <part>])", e.g.
// "matbus/v1.4.0 (worker; worker-0)" or "matbus/v1.4.0 (worker; worker-0;
// readiness)". The API server's audit log records it, so every request
// can be traced to the process and the part of it that sent it. Characters
// outside printable ASCII and the parentheses and semicolons of the
// format are replaced by '_' so a pod or host name cannot break it.
func kubeUserAgent(subcommand, instance string, part ...string) string {
	fields := append([]string{subcommand, instance}, part...)
	for i, f := range fields {
		fields[i] = strings.Map(func(r rune) rune {
			if r < 0x21 || r > 0x7e || r == '(' || r == ')' || r == ';' {
				return '_'
			}
			return r
		}, f)
	}
	return "matbus/" + version + " (" + strings.Join(fields, "; ") + ")"
}
