package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// auditEvent is the part of one audit.k8s.io/v1 Event (one JSON line of
// the API server's audit log at level Metadata) that the harness reads.
type auditEvent struct {
	Stage     string `json:"stage"` // ResponseStarted (watches), ResponseComplete, Panic
	Verb      string `json:"verb"`  // get, list, watch, create, update, patch, delete, …
	URI       string `json:"requestURI"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Received time.Time `json:"requestReceivedTimestamp"`
}

// request is the key of an audit event: "VERB resource[/subresource]"
// ("VERB /path" for a request without an object, e.g. "GET /readyz"), the
// response code appended when it is not 2xx, like requestCounts'.
func (e *auditEvent) request() string {
	res := ""
	if e.ObjectRef != nil && e.ObjectRef.Resource != "" {
		res = e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
	} else {
		res, _, _ = strings.Cut(e.URI, "?")
	}
	key := strings.ToUpper(e.Verb) + " " + res
	if c := e.code(); c != 0 && (c < 200 || c > 299) {
		key += fmt.Sprintf(" %d", c)
	}
	return key
}

func (e *auditEvent) code() int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

// counted says whether e is the one event of its request that the
// harness counts: a watch when it started (or, when it never started,
// its failure), any other request when it completed (or panicked).
func (e *auditEvent) counted() bool {
	switch e.Stage {
	case "ResponseStarted":
		return e.Verb == "watch"
	case "ResponseComplete":
		return e.Verb != "watch" || e.code() < 200 || e.code() > 299
	case "Panic":
		return true
	}
	return false
}

// harnessAgent is the User-Agent of the harness's own clients.
const harnessAgent = "matbus-bench-e2e"

// clientOf names the client of a User-Agent: "harness" for the harness,
// "matbus <subcommand> <instance>[ <part>]" for a matbus process
// ("matbus/v1 (worker; worker-0)" → "matbus worker worker-0"), "matbus"
// for one that does not say which it is, else the product token
// ("kube-apiserver/v1.37.2 (linux/amd64) kubernetes/abc" →
// "kube-apiserver"); "unknown" for none.
func clientOf(ua string) string {
	switch {
	case ua == "":
		return "unknown"
	case ua == harnessAgent:
		return "harness"
	case strings.HasPrefix(ua, "matbus/"):
		_, rest, ok := strings.Cut(ua, "(")
		inner, _, closed := strings.Cut(rest, ")")
		if !ok || !closed {
			return "matbus"
		}
		return "matbus " + strings.Join(strings.Fields(strings.ReplaceAll(inner, ";", " ")), " ")
	}
	name, _, _ := strings.Cut(ua, " ")
	name, _, _ = strings.Cut(name, "/")
	return name
}

// isMatbus says whether a client of clientOf is a matbus process.
func isMatbus(client string) bool { return client == "matbus" || strings.HasPrefix(client, "matbus ") }

// auditCounts are the requests of a window by client (clientOf) and
// request (auditEvent.request).
type auditCounts map[string]requestCounts

// Total is the number of requests of every client matching keep (nil:
// every client).
func (a auditCounts) Total(keep func(client string) bool) float64 {
	var t float64
	for c, rc := range a {
		if keep == nil || keep(c) {
			t += rc.Total()
		}
	}
	return t
}

// String is "client: VERB resource=n, …" per client, matbus processes
// first, then by falling count, separated by "; ".
func (a auditCounts) String() string {
	clients := make([]string, 0, len(a))
	for c := range a {
		clients = append(clients, c)
	}
	slices.SortFunc(clients, func(x, y string) int {
		if mx, my := isMatbus(x), isMatbus(y); mx != my {
			if mx {
				return -1
			}
			return 1
		}
		if tx, ty := a[x].Total(), a[y].Total(); tx != ty {
			if tx > ty {
				return -1
			}
			return 1
		}
		return strings.Compare(x, y)
	})
	parts := make([]string, 0, len(clients))
	for _, c := range clients {
		parts = append(parts, c+": "+a[c].String())
	}
	return strings.Join(parts, "; ")
}

// parseAudit reads audit log lines from r and counts the requests
// received in [from, to) by client. Lines that are not JSON objects (a
// line cut short at the end of the file) are skipped and counted in bad.
func parseAudit(r io.Reader, from, to time.Time) (counts auditCounts, bad int, err error) {
	counts = auditCounts{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e auditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			bad++
			continue
		}
		if !e.counted() || e.Received.Before(from) || !e.Received.Before(to) {
			continue
		}
		c := clientOf(e.UserAgent)
		if counts[c] == nil {
			counts[c] = requestCounts{}
		}
		counts[c][e.request()]++
	}
	return counts, bad, sc.Err()
}

// auditLog reads the API server's audit log (kubelocal.Config.Audit).
type auditLog struct{ path string }

// Offset is the log's size now: a window's events are logged after it.
func (l auditLog) Offset() int64 {
	st, err := os.Stat(l.path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// auditGrace is how long after a window the harness waits before it reads
// the log: a request received in the window is logged when it completes.
const auditGrace = time.Second

// Window counts the requests received in [from, to) from the events
// logged after offset (Offset before the window).
func (l auditLog) Window(offset int64, from, to time.Time) (auditCounts, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	counts, _, err := parseAudit(f, from, to)
	if err != nil {
		return nil, fmt.Errorf("audit log %s: %w", l.path, err)
	}
	return counts, nil
}
