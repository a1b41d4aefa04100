package main

import (
	"bufio"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// percentile returns the p-th percentile (0 < p <= 100) of ds by the
// nearest-rank method: the smallest value such that at least p % of the
// values are at or below it. It returns 0 for an empty slice and does not
// modify ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = max(1, min(rank, len(s)))
	return s[rank-1]
}

// requestCounts is apiserver_request_total summed by "VERB resource"
// ("VERB resource/subresource"; "VERB /path" for nonResource requests,
// e.g. "GET /readyz"), with the response code appended when it is not 2xx
// ("DELETE services 404").
type requestCounts map[string]float64

// Total is the sum over every key.
func (c requestCounts) Total() float64 {
	var t float64
	for _, v := range c {
		t += v
	}
	return t
}

// Sub returns c − base per key, keeping keys whose difference is not 0.
func (c requestCounts) Sub(base requestCounts) requestCounts {
	out := requestCounts{}
	for k, v := range c {
		if d := v - base[k]; d != 0 {
			out[k] = d
		}
	}
	for k, v := range base {
		if _, ok := c[k]; !ok && v != 0 {
			out[k] = -v
		}
	}
	return out
}

// String lists the keys by falling count, "VERB resource=n", comma separated.
func (c requestCounts) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c[a] != c[b] {
			if c[a] > c[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%g", strings.TrimSpace(k), c[k]))
	}
	return strings.Join(parts, ", ")
}

// parseRequestTotal reads apiserver_request_total from a Prometheus text
// exposition (what the API server's /metrics answers) and sums it by verb
// and resource (see requestCounts). Other metrics are skipped; a sample
// line that does not parse is an error.
func parseRequestTotal(text string) (requestCounts, error) {
	const name = "apiserver_request_total"
	out := requestCounts{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue // another metric with this prefix
		}
		labels := map[string]string{}
		if rest[0] == '{' {
			var err error
			labels, rest, err = parseLabels(rest)
			if err != nil {
				return nil, fmt.Errorf("%s: %w in %q", name, err, line)
			}
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("%s: no value in %q", name, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value in %q: %w", name, line, err)
		}
		res := labels["resource"]
		switch sub := labels["subresource"]; {
		case res == "" && sub != "": // a nonResource path, e.g. "/readyz" or "openapi/v3"
			res = "/" + strings.TrimPrefix(sub, "/")
		case sub != "":
			res += "/" + sub
		}
		key := labels["verb"] + " " + res
		if code := labels["code"]; code != "" && !strings.HasPrefix(code, "2") {
			key += " " + code // failures apart: "DELETE services 404"
		}
		out[key] += v
	}
	return out, sc.Err()
}

// parseLabels parses `{k="v",...}` at the start of s (values with \\, \"
// and \n escapes) and returns the labels and what follows the closing
// brace.
func parseLabels(s string) (map[string]string, string, error) {
	out := map[string]string{}
	i := 1 // after '{'
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == ',') {
			i++
		}
		if i >= len(s) {
			return nil, "", fmt.Errorf("unterminated labels")
		}
		if s[i] == '}' {
			return out, s[i+1:], nil
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq <= 0 {
			return nil, "", fmt.Errorf("label without '='")
		}
		key := strings.TrimSpace(s[i : i+eq])
		i += eq + 1
		if i >= len(s) || s[i] != '"' {
			return nil, "", fmt.Errorf("label %s: value not quoted", key)
		}
		i++
		var b strings.Builder
		for {
			if i >= len(s) {
				return nil, "", fmt.Errorf("label %s: unterminated value", key)
			}
			c := s[i]
			if c == '"' {
				i++
				break
			}
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i])
				}
				i++
				continue
			}
			b.WriteByte(c)
			i++
		}
		out[key] = b.String()
	}
}

var (
	helpFlagLine = regexp.MustCompile(`^\s+--([A-Za-z0-9][A-Za-z0-9-]*)\b`)
	helpDefault  = regexp.MustCompile(`\(default ([^()]*)\)\s*$`)
)

// parseHelpDefaults reads the defaults from `matbus <subcommand> --help`:
// each flag line ("  --name  [env X]") followed by its description, which
// ends in "(default V)" when there is one. It returns flag name → V.
func parseHelpDefaults(help string) map[string]string {
	out := map[string]string{}
	cur := ""
	for _, line := range strings.Split(help, "\n") {
		if m := helpFlagLine.FindStringSubmatch(line); m != nil {
			cur = m[1]
			if d := helpDefault.FindStringSubmatch(line); d != nil {
				out[cur] = d[1]
			}
			continue
		}
		if cur == "" {
			continue
		}
		if d := helpDefault.FindStringSubmatch(line); d != nil {
			out[cur] = d[1]
		}
	}
	return out
}

// memStatus reads VmRSS and VmHWM (bytes) from the text of /proc/<pid>/status.
func memStatus(status string) (rss, hwm int64, err error) {
	found := 0
	for _, line := range strings.Split(status, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("%s: unexpected %q", key, val)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", key, err)
		}
		if key == "VmRSS" {
			rss = n * 1024
		} else {
			hwm = n * 1024
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("VmRSS or VmHWM missing")
	}
	return rss, hwm, nil
}

// parseWorkers parses "1,3" into worker counts (each >= 1). An empty item
// ("1,,3") is an error, not skipped.
func parseWorkers(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("--workers: empty list")
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return nil, fmt.Errorf("--workers: empty item in %q", s)
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--workers: %q is not a positive number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--workers: empty list")
	}
	return out, nil
}
