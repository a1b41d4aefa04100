package events

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestKey(t *testing.T) {
	cases := []struct {
		name, ns, n string
		wantErr     string
	}{
		{"valid", "mat-system", "mat-0-bmc-mock", ""},
		{"dot in name", "ns", "a.b", "not a DNS label"},
		{"upper case", "ns", "Mat", "not a DNS label"},
		{"empty namespace", "", "x", "namespace"},
		{"too long", "ns", strings.Repeat("a", 64), "not a DNS label"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, err := Key(c.ns, c.n)
			if c.wantErr == "" {
				if err != nil || key != c.ns+"."+c.n {
					t.Fatalf("Key = %q, %v", key, err)
				}
				ns, n, err := SplitKey(key)
				if err != nil || ns != c.ns || n != c.n {
					t.Fatalf("SplitKey(%q) = %q %q %v", key, ns, n, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Key(%q,%q) error = %v, want %q", c.ns, c.n, err, c.wantErr)
			}
		})
	}
}

func TestSubjects(t *testing.T) {
	s := Subjects{Prefix: "lab.mat"}
	got := []string{s.Instance("ns.a"), s.Sync("ns.a"), s.Cleanup("ns.a"), s.Delete("ns.a"), s.Error(ErrorDelete), s.Errors()}
	want := []string{"lab.mat.instances.ns.a", "lab.mat.jobs.sync.ns.a", "lab.mat.jobs.cleanup.ns.a", "lab.mat.jobs.delete.ns.a", "lab.mat.errors.delete", "lab.mat.errors.>"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("subject %d = %q, want %q", i, got[i], want[i])
		}
	}
	if (Subjects{}).Sync("a.b") != "mat.jobs.sync.a.b" {
		t.Errorf("zero Subjects does not use the default prefix")
	}
	if k, ok := KeyFromSubject("mat.jobs.delete.ns.name"); !ok || k != "ns.name" {
		t.Errorf("KeyFromSubject = %q %v", k, ok)
	}
	for _, bad := range []string{"", "a..b", "a b", "a.*", "a.>"} {
		if ValidatePrefix(bad) == nil {
			t.Errorf("ValidatePrefix(%q) accepted", bad)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	inst := Instance{Key: "ns.mat-0", URL: "https://10.0.0.1:1266", Scope: "static:dev", Version: "v1"}
	body, err := Encode(TypeInstanceAppeared, "id-1", "test", now, inst)
	if err != nil {
		t.Fatal(err)
	}
	env, err := Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	if env.Schema != SchemaVersion || env.ID != "id-1" || env.Source != "test" || !env.Time.Equal(now) {
		t.Fatalf("envelope = %+v", env)
	}
	got, err := Into[Instance](env, TypeInstanceAppeared, TypeInstanceGone)
	if err != nil || got != inst {
		t.Fatalf("Into = %+v, %v", got, err)
	}
	if _, err := Into[DeleteJob](env, TypeDeleteJob); !errors.Is(err, ErrWrongType) {
		t.Fatalf("Into with the wrong type: %v", err)
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := func(mut func(m map[string]any)) []byte {
		m := map[string]any{"schema": 1, "type": string(TypeSyncJob), "id": "x", "time": "2026-12-01T00:00:00Z", "source": "t",
			"data": map[string]any{"key": "ns.a", "reason": "tick"}}
		mut(m)
		b, _ := json.Marshal(m)
		return b
	}
	cases := []struct {
		name string
		body []byte
		want error
	}{
		{"not json", []byte("not json"), ErrMalformed},
		{"empty", nil, ErrMalformed},
		{"trailing data", append(valid(func(map[string]any) {}), []byte(` {}`)...), ErrMalformed},
		{"schema 99", valid(func(m map[string]any) { m["schema"] = 99 }), ErrUnknownSchema},
		{"schema missing", valid(func(m map[string]any) { delete(m, "schema") }), ErrUnknownSchema},
		{"schema as string", valid(func(m map[string]any) { m["schema"] = "1" }), ErrMalformed},
		{"unknown type", valid(func(m map[string]any) { m["type"] = "io.matbus.job.explode" }), ErrUnknownType},
		{"no id", valid(func(m map[string]any) { delete(m, "id") }), ErrMalformed},
		{"no data", valid(func(m map[string]any) { delete(m, "data") }), ErrMalformed},
		{"null data", valid(func(m map[string]any) { m["data"] = nil }), ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.body)
			if !errors.Is(err, c.want) {
				t.Fatalf("Decode error = %v, want %v", err, c.want)
			}
		})
	}
}

func TestIntoValidates(t *testing.T) {
	cases := []struct {
		name string
		typ  Type
		data any
		into func(Envelope) error
	}{
		{"sync key without dot", TypeSyncJob, map[string]any{"key": "nodot"}, func(e Envelope) error { _, err := Into[SyncJob](e); return err }},
		{"delete without uid", TypeDeleteJob, map[string]any{"key": "ns.a", "namespace": "ns", "name": "svc"}, func(e Envelope) error { _, err := Into[DeleteJob](e); return err }},
		{"instance with ftp url", TypeInstanceAppeared, map[string]any{"key": "ns.a", "url": "ftp://x", "scope": "s"}, func(e Envelope) error { _, err := Into[Instance](e); return err }},
		{"instance without scope", TypeInstanceAppeared, map[string]any{"key": "ns.a", "url": "https://x:1"}, func(e Envelope) error { _, err := Into[Instance](e); return err }},
		{"data of wrong shape", TypeSyncJob, []int{1, 2}, func(e Envelope) error { _, err := Into[SyncJob](e); return err }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body, err := Encode(c.typ, "id", "t", time.Now(), c.data)
			if err != nil {
				t.Fatal(err)
			}
			env, err := Decode(body)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.into(env); !errors.Is(err, ErrMalformed) {
				t.Fatalf("error = %v, want ErrMalformed", err)
			}
		})
	}
}

// FuzzDecode feeds arbitrary bytes to Decode and Into: no panic, and every
// rejection wraps one of the package's sentinel errors.
func FuzzDecode(f *testing.F) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	seeds := []struct {
		typ  Type
		data any
	}{
		{TypeInstanceAppeared, Instance{Key: "ns.a", URL: "https://h:1266", Scope: "static:x"}},
		{TypeInstanceGone, Instance{Key: "ns.a", URL: "https://h:1266", Scope: "static:x"}},
		{TypeSyncJob, SyncJob{Key: "ns.a", Reason: "tick"}},
		{TypeCleanupJob, CleanupJob{Key: "ns.a", Scope: "static:x"}},
		{TypeDeleteJob, DeleteJob{Key: "ns.a", Namespace: "ns", Name: "svc", UID: "u", Reason: "stale"}},
		{TypeError, Error{Kind: ErrorFetch, Message: "boom"}},
	}
	for _, s := range seeds {
		b, err := Encode(s.typ, "id", "fuzz", now, s.data)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	withEpoch, err := EncodeEpoch(TypeSyncJob, "id", "fuzz", now, &Epoch{Lease: "ns/l", Term: 3, Leader: "d"}, SyncJob{Key: "ns.a", Reason: ReasonPoll})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(withEpoch)
	f.Add([]byte(`{"schema":99}`))
	f.Add([]byte(`{"schema":1,"type":"io.matbus.job.sync","id":"x","data":null}`))
	f.Add([]byte("\x00\xff garbage"))
	sentinels := []error{ErrMalformed, ErrUnknownSchema, ErrUnknownType, ErrWrongType}
	isSentinel := func(err error) bool {
		for _, s := range sentinels {
			if errors.Is(err, s) {
				return true
			}
		}
		return false
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := Decode(body)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("Decode error without a sentinel: %v", err)
			}
			return
		}
		if env.Schema != SchemaVersion || env.ID == "" || env.Type == "" {
			t.Fatalf("Decode accepted an invalid envelope: %+v", env)
		}
		if e := env.Epoch; e != nil && (e.Lease == "" || e.Leader == "" || e.Term < 0) {
			t.Fatalf("Decode accepted an invalid epoch: %+v", *e)
		}
		var errs []error
		_, e1 := Into[Instance](env, TypeInstanceAppeared, TypeInstanceGone)
		_, e2 := Into[SyncJob](env, TypeSyncJob)
		_, e3 := Into[CleanupJob](env, TypeCleanupJob)
		_, e4 := Into[DeleteJob](env, TypeDeleteJob)
		_, e5 := Into[Error](env, TypeError)
		errs = append(errs, e1, e2, e3, e4, e5)
		for _, e := range errs {
			if e != nil && !isSentinel(e) {
				t.Fatalf("Into error without a sentinel: %v", e)
			}
		}
	})
}

// A URL's user info, query and fragment never appear in a validation
// error; a port out of range is refused.
func TestValidateURLHidesCredentials(t *testing.T) {
	for _, raw := range []string{
		"https://admin:Pa55word@127.0.0.1:21266/?token=abc123",
		"https://127.0.0.1:1/?access_token=SECRETQ",
		"https://127.0.0.1:1/#frag-SECRETQ",
		"https://u:Pa55word@127.0.0.1:1",
		"ftp://u:Pa55word@host/?token=abc123",
		"https://127.0.0.1:1/%zz?token=abc123",
	} {
		err := ValidateURL(raw)
		if err == nil {
			t.Errorf("ValidateURL(%q) accepted", raw)
			continue
		}
		for _, secret := range []string{"Pa55word", "abc123", "SECRETQ"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("ValidateURL(%q) = %q: shows %s", raw, err, secret)
			}
		}
	}
	if err := ValidateURL("https://127.0.0.1:99999"); err == nil || !strings.Contains(err.Error(), "99999") {
		t.Errorf("port 99999: %v", err)
	}
	if err := ValidateURL("https://127.0.0.1:1266"); err != nil {
		t.Errorf("a good URL: %v", err)
	}
}

// SyncResult.NotModified is compatible both ways: a result of an older
// worker (no not_modified) decodes as false; a result without it encodes
// as before (no new key); and one with it decodes into a SyncResult of
// an older build, which has no such field.
func TestSyncResultNotModifiedWire(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	decode := func(t *testing.T, data any) Envelope {
		t.Helper()
		body, err := Encode(TypeSyncResult, "r", "w1", now, data)
		if err != nil {
			t.Fatal(err)
		}
		env, err := Decode(body)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	old := map[string]any{"key": "ns.a", "job_id": "j", "outcome": OutcomeUnchanged, "duration_ms": 1, "worker": "w1"}
	r, err := Into[SyncResult](decode(t, old), TypeSyncResult)
	if err != nil || r.NotModified || r.Outcome != OutcomeUnchanged {
		t.Fatalf("older worker's result: %+v, %v", r, err)
	}

	plain, _ := json.Marshal(SyncResult{Key: "ns.a", JobID: "j", Outcome: OutcomeUnchanged})
	if strings.Contains(string(plain), "not_modified") {
		t.Fatalf("result without NotModified encodes %s", plain)
	}

	type olderSyncResult struct {
		Key        string `json:"key"`
		JobID      string `json:"job_id"`
		Outcome    string `json:"outcome"`
		Error      string `json:"error,omitempty"`
		Transient  bool   `json:"transient,omitempty"`
		DurationMS int64  `json:"duration_ms"`
		Worker     string `json:"worker,omitempty"`
	}
	env := decode(t, SyncResult{Key: "ns.a", JobID: "j", Outcome: OutcomeUnchanged, NotModified: true})
	if !strings.Contains(string(env.Data), `"not_modified":true`) {
		t.Fatalf("data %s lacks not_modified", env.Data)
	}
	o, err := Into[olderSyncResult](env, TypeSyncResult)
	if err != nil || o.Key != "ns.a" || o.Outcome != OutcomeUnchanged {
		t.Fatalf("older build's decode: %+v, %v", o, err)
	}
	if r, err := Into[SyncResult](env, TypeSyncResult); err != nil || !r.NotModified {
		t.Fatalf("decode: %+v, %v", r, err)
	}
}
