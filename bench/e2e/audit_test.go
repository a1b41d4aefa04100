package main

import (
	"strings"
	"testing"
	"time"
)

// auditLines are audit.k8s.io/v1 events as kube-apiserver writes them at
// level Metadata with --audit-log-format=json (one per line): a worker's
// informer list and watch (started, then ended), a harness create, the API
// server's own lease update and ClusterIP repair list, a failed watch that
// never started, a non-resource GET, an event outside the window and a
// line cut short at the end of the file.
const auditLines = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a01","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/bench-r1-w3/services?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmat-k8s-controller\u0026limit=500\u0026resourceVersion=0","verb":"list","user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"matbus/dev (worker; worker-1)","objectRef":{"resource":"services","namespace":"bench-r1-w3","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-08-01T10:00:01.100000Z","stageTimestamp":"2026-08-01T10:00:01.120000Z","annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":""}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a02","stage":"ResponseStarted","requestURI":"/api/v1/namespaces/bench-r1-w3/services?allowWatchBookmarks=true\u0026labelSelector=app.kubernetes.io%2Fmanaged-by%3Dmat-k8s-controller\u0026resourceVersion=5101\u0026timeout=8m21s\u0026timeoutSeconds=501\u0026watch=true","verb":"watch","user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"matbus/dev (worker; worker-1)","objectRef":{"resource":"services","namespace":"bench-r1-w3","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-08-01T10:00:01.130000Z","stageTimestamp":"2026-08-01T10:00:01.131000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a03","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/bench-r1-w3/services?allowWatchBookmarks=true\u0026resourceVersion=4000\u0026watch=true","verb":"watch","user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"matbus/dev (worker; worker-2)","objectRef":{"resource":"services","namespace":"bench-r1-w3","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-08-01T09:52:00.000000Z","stageTimestamp":"2026-08-01T10:00:02.000000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a04","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/bench-r1-w3/services","verb":"create","user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"matbus-bench-e2e","objectRef":{"resource":"services","namespace":"bench-r1-w3","name":"x","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":"2026-08-01T10:00:03.000000Z","stageTimestamp":"2026-08-01T10:00:03.010000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a05","stage":"ResponseComplete","requestURI":"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/apiserver-abc","verb":"update","user":{"username":"system:apiserver","uid":"u","groups":["system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"kube-apiserver/v1.37.2 (linux/amd64) kubernetes/d1b4d4c","objectRef":{"resource":"leases","namespace":"kube-system","name":"apiserver-abc","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-08-01T10:00:04.000000Z","stageTimestamp":"2026-08-01T10:00:04.003000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a06","stage":"ResponseComplete","requestURI":"/api/v1/services","verb":"list","user":{"username":"system:apiserver","uid":"u","groups":["system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"kube-apiserver/v1.37.2 (linux/amd64) kubernetes/d1b4d4c","objectRef":{"resource":"services","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-08-01T10:00:05.000000Z","stageTimestamp":"2026-08-01T10:00:05.100000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a07","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/bench-r1-w3/services?resourceVersion=12\u0026watch=true","verb":"watch","user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"matbus/dev (worker; worker-0)","objectRef":{"resource":"services","namespace":"bench-r1-w3","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure","reason":"Expired","code":410},"requestReceivedTimestamp":"2026-08-01T10:00:06.000000Z","stageTimestamp":"2026-08-01T10:00:06.001000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a08","stage":"ResponseComplete","requestURI":"/readyz?verbose","verb":"get","user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"Go-http-client/1.1","responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-08-01T10:00:07.000000Z","stageTimestamp":"2026-08-01T10:00:07.001000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a09","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/endpoints/kubernetes","verb":"get","user":{"username":"system:apiserver","groups":["system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"kube-apiserver/v1.37.2 (linux/amd64) kubernetes/d1b4d4c","objectRef":{"resource":"endpoints","namespace":"default","name":"kubernetes","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-08-01T10:01:30.000000Z","stageTimestamp":"2026-08-01T10:01:30.001000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"0b6b9f0e-7a1e-4c57-9e39-3b1f1c0f0a10","stage":"ResponseCompl`

func TestParseAudit(t *testing.T) {
	from := time.Date(2026, 8, 1, 10, 0, 0, 0, time.UTC)
	counts, bad, err := parseAudit(strings.NewReader(auditLines), from, from.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if bad != 1 {
		t.Errorf("bad lines = %d, want 1 (the cut one)", bad)
	}
	want := map[string]map[string]float64{
		"matbus worker worker-1": {"LIST services": 1, "WATCH services": 1},
		"matbus worker worker-0": {"WATCH services 410": 1},
		"harness":                {"CREATE services": 1},
		"kube-apiserver":         {"UPDATE leases": 1, "LIST services": 1},
		"Go-http-client":         {"GET /readyz": 1},
	}
	if len(counts) != len(want) {
		t.Errorf("clients = %v, want %v", counts, want)
	}
	for c, reqs := range want {
		for k, n := range reqs {
			if counts[c][k] != n {
				t.Errorf("%s %q = %g, want %g (all: %v)", c, k, counts[c][k], n, counts)
			}
		}
		if len(counts[c]) != len(reqs) {
			t.Errorf("%s: %v, want %v", c, counts[c], reqs)
		}
	}
	if got := counts.Total(isMatbus); got != 3 {
		t.Errorf("matbus total = %g, want 3", got)
	}
	if got := counts.Total(nil); got != 7 {
		t.Errorf("total = %g, want 7", got)
	}
	s := counts.String()
	if !strings.HasPrefix(s, "matbus worker worker-1: LIST services=1, WATCH services=1; matbus worker worker-0: WATCH services 410=1; ") {
		t.Errorf("String() = %q: matbus clients first, by falling count", s)
	}
}

func TestClientOf(t *testing.T) {
	for ua, want := range map[string]string{
		"":                                       "unknown",
		"matbus-bench-e2e":                       "harness",
		"matbus/dev":                             "matbus",
		"matbus/v1.2.0 (worker; w-0)":            "matbus worker w-0",
		"matbus/v1.2.0 (worker; w-0; readiness)": "matbus worker w-0 readiness",
		"matbus/dev (discovery; discovery)":      "matbus discovery discovery",
		"kube-apiserver/v1.37.2 (linux/amd64) kubernetes/d1b4d4c":                 "kube-apiserver",
		"kube-apiserver/v1.37.2 (linux/amd64) kubernetes/d1b4d4c/leader-election": "kube-apiserver",
	} {
		if got := clientOf(ua); got != want {
			t.Errorf("clientOf(%q) = %q, want %q", ua, got, want)
		}
	}
}
