package devenv

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/matbus/matbus/discovery"
)

// TestIPTakenHint: the error events of a BMC IP that another Service holds,
// as the worker words them and as the API server does, get dev's hint to
// move the fleet to other subnets; other errors do not.
func TestIPTakenHint(t *testing.T) {
	for _, tt := range []struct {
		msg  string
		want bool
	}{
		{`cluster IP 10.96.64.6 is allocated to another Service: Service "mat-bmc-host-x" is invalid`, true},
		{`Service "mat-bmc-host-x" is invalid: spec.clusterIPs: Invalid value: ["10.96.64.6"]: failed to allocate IP 10.96.64.6: provided IP is already allocated`, true},
		{`status fetch failed, no Service changed: connection refused`, false},
		{`Service "mat-bmc-host-x" is invalid: spec.clusterIPs: Invalid value: ["10.200.0.1"]: failed to allocate IP 10.200.0.1: the provided IP (10.200.0.1) is not in the valid range`, false},
	} {
		data, err := json.Marshal(map[string]string{"message": tt.msg})
		if err != nil {
			t.Fatal(err)
		}
		if got := ipTaken(data); got != tt.want {
			t.Errorf("ipTaken(%q) = %v, want %v", tt.msg, got, tt.want)
		}
	}
	if !strings.Contains(ipTakenHint, "--bmc-subnet") || !strings.Contains(ipTakenHint, "--nvos-subnet") {
		t.Errorf("the hint names no flag to change: %s", ipTakenHint)
	}
}

// TestDevNextSteps: the next-step block names this run's addresses in
// every command, passes the flags that change what status, plan and check
// must look at, and quotes what a shell would split.
func TestDevNextSteps(t *testing.T) {
	got := NextSteps(Steps{
		NATSURL: "nats://127.0.0.1:4333", Namespace: "ns1", Kubeconfig: "/tmp/a b/kubeconfig", SourcesURL: "http://127.0.0.1:8099",
		Entries: []discovery.StaticEntry{{Name: "mat-0", URL: "https://127.0.0.1:1"}, {Name: "mat-1", URL: "https://127.0.0.1:2"}},
		Flags:   []string{"--subject-prefix=lab", "--managed-by=me", "--bmc-ip-mode=external-ip"},
	})
	var cmds []string
	for _, l := range strings.Split(got, "\n") {
		if strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "  #") {
			cmds = append(cmds, strings.TrimPrefix(l, "  "))
		}
	}
	want := []string{
		"bin/matbus status --nats-url nats://127.0.0.1:4333 --namespace ns1 --kubeconfig '/tmp/a b/kubeconfig' --subject-prefix=lab --managed-by=me --bmc-ip-mode=external-ip --sources-url http://127.0.0.1:8099",
		"bin/matbus errors --nats-url nats://127.0.0.1:4333 --since 1h --subject-prefix=lab",
		"bin/matbus plan --kubeconfig '/tmp/a b/kubeconfig' --namespace ns1 --static mat-0=https://127.0.0.1:1,mat-1=https://127.0.0.1:2 --insecure-skip-verify --subject-prefix=lab --managed-by=me --bmc-ip-mode=external-ip",
		"bin/matbus check --nats-url nats://127.0.0.1:4333 --kubeconfig '/tmp/a b/kubeconfig' --namespace ns1 --static mat-0=https://127.0.0.1:1,mat-1=https://127.0.0.1:2 --insecure-skip-verify --subject-prefix=lab --managed-by=me --bmc-ip-mode=external-ip",
		"KUBECONFIG='/tmp/a b/kubeconfig' kubectl get svc -n ns1 -l app.kubernetes.io/managed-by=me",
		"curl -sSk -X PUT --data 500 https://127.0.0.1:2/matsim/fault",
	}
	if strings.Join(cmds, "\n") != strings.Join(want, "\n") {
		t.Errorf("next steps:\n%s\nwant the commands:\n%s", got, strings.Join(want, "\n"))
	}
	if !strings.HasPrefix(got, "Next steps") {
		t.Errorf("block does not start with its title:\n%s", got)
	}
	for in, want := range map[string]string{"plain-1.2/x:y=z,w@v": "plain-1.2/x:y=z,w@v", "": "''", "a'b": `'a'\''b'`, "$HOME": "'$HOME'"} {
		if got := ShellQuote(in); got != want {
			t.Errorf("ShellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
