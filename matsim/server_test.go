package matsim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/matbus/matbus/internal/testenv"
	"github.com/matbus/matbus/matclient"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fixtures lives in matclient's testdata (copies of the shared fixtures).
var fixtures = filepath.Join("..", "matclient", "testdata")

func start(t *testing.T, opts Options) (*Server, string) {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	url, err := s.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, url
}

func client(t *testing.T, url string, cfg matclient.Config) *matclient.Client {
	t.Helper()
	c, err := matclient.New(url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func status(t *testing.T, c *matclient.Client) *matclient.Status {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if err := st.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return st
}

var fullSpec = FleetSpec{Hosts: 5, DPUsPerHost: 2, Switches: 2, PowerShelves: 2, IPMI: true, SSH: true, Seed: 11}

func TestServeV2(t *testing.T) {
	f := mustGenerate(t, fullSpec)
	s, url := start(t, Options{Fleet: f, EpochID: "2026-08-21T19:04:05.417203981Z"})
	st := status(t, client(t, url, matclient.Config{}))
	if st.Schema != matclient.SchemaV2 || st.Generation != 1 || st.InventoryID != f.InventoryID || st.EpochID != "2026-08-21T19:04:05.417203981Z" {
		t.Errorf("status identity = %v %d %q %q", st.Schema, st.Generation, st.InventoryID, st.EpochID)
	}
	// What the client decodes is exactly the fleet.
	if !reflect.DeepEqual(st.Machines, f.Machines) {
		t.Errorf("decoded machines differ from the fleet")
	}
	if s.Devices() != 5*3+4 || s.BMCs() != 5*3+4 || s.Generation() != 1 {
		t.Errorf("Devices %d BMCs %d Generation %d", s.Devices(), s.BMCs(), s.Generation())
	}
	if s.Fault() != FaultNone || !strings.HasPrefix(url, "http://127.0.0.1:") || s.URL() != url {
		t.Errorf("fault %v url %q", s.Fault(), url)
	}
}

func TestServeDefaultEpoch(t *testing.T) {
	_, url := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 1})})
	st := status(t, client(t, url, matclient.Config{}))
	ts, err := time.Parse(time.RFC3339Nano, st.EpochID)
	if err != nil || time.Since(ts) > time.Minute || len(st.EpochID) != len("2026-08-21T19:04:05.417203981Z") {
		t.Errorf("epoch %q: %v", st.EpochID, err)
	}
}

func TestServeLegacy(t *testing.T) {
	f := mustGenerate(t, fullSpec)
	_, url := start(t, Options{Fleet: f, Legacy: true})
	st := status(t, client(t, url, matclient.Config{}))
	if st.Schema != matclient.SchemaLegacy || st.Generation != 0 || st.InventoryID != "" {
		t.Errorf("schema %v generation %d inventory %q", st.Schema, st.Generation, st.InventoryID)
	}
	if got, want := st.Counts(), f.Status("", 1).Counts(); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	i := 0
	st.Walk(func(d, parent *matclient.Device) {
		want, _ := find(f, d.MatID)
		if want == nil {
			t.Fatalf("unknown device %s", d.MatID)
		}
		// Kinds are derived the way MAT does; v2-only fields are gone.
		if d.Kind != want.Kind || d.DeviceID != "" || d.NvosIP != "" || d.BMC.SSH != nil || d.InfinibandPorts != nil {
			t.Errorf("legacy device %+v", d)
		}
		if d.BMC.IP != want.BMC.IP || !reflect.DeepEqual(d.BMC.IPMI, want.BMC.IPMI) || d.MachineID != want.MachineID {
			t.Errorf("legacy device %s bmc %+v", d.MatID, d.BMC)
		}
		i++
	})
	if i != f.Devices() {
		t.Errorf("walked %d devices", i)
	}
}

func find(f *Fleet, matID string) (dev *matclient.Device, parent *matclient.Device) {
	for i := range f.Machines {
		if f.Machines[i].MatID == matID {
			return &f.Machines[i], nil
		}
		for j := range f.Machines[i].DPUs {
			if f.Machines[i].DPUs[j].MatID == matID {
				return &f.Machines[i].DPUs[j], &f.Machines[i]
			}
		}
	}
	return nil, nil
}

func get(t *testing.T, method, url string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func TestServeFixture(t *testing.T) {
	tests := []struct {
		file           string
		devices, bmcs  int
		wantDecodeFail bool
	}{
		{"v2-mixed.json", 10, 8, false},
		{"legacy-small.json", 5, 4, false},
		{"v2-empty.json", 0, 0, false},
		{"long-ids.json", 12, 12, false},
		{"malformed/duplicate-bmc-ip.json", 2, 2, false},
		{"malformed/truncated.json", 0, 0, true},
		{"malformed/null-machines.json", 0, 0, true},
		{"malformed/trailing-data.json", 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join(fixtures, tt.file)
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var logs testenv.Buffer
			s, url := start(t, Options{FixturePath: path, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			// A fixture that does not decode is named in a warning: its
			// 0 devices are not a fleet of none.
			if warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "fixture="+path) &&
				strings.Contains(logs.String(), "error="); warned != tt.wantDecodeFail {
				t.Errorf("warned %v, want %v: %q", warned, tt.wantDecodeFail, logs.String())
			}
			code, got := get(t, http.MethodGet, url+"/machines/status")
			if code != http.StatusOK || !bytes.Equal(got, want) {
				t.Errorf("GET = %d, %d bytes; want 200 and the file byte for byte (%d bytes)", code, len(got), len(want))
			}
			if s.Devices() != tt.devices || s.BMCs() != tt.bmcs {
				t.Errorf("Devices %d BMCs %d, want %d %d", s.Devices(), s.BMCs(), tt.devices, tt.bmcs)
			}
			_, err = client(t, url, matclient.Config{}).Status(context.Background())
			if (err != nil) != tt.wantDecodeFail || (err != nil && !errors.Is(err, matclient.ErrInvalidStatus)) {
				t.Errorf("Status error = %v, want failure %v", err, tt.wantDecodeFail)
			}
			if !errors.Is(s.RemoveDevice("x"), ErrFixtureMode) || !errors.Is(s.SetBMCIP("x", ""), ErrFixtureMode) {
				t.Error("fixture servers cannot be changed device by device")
			}
			if s.Fleet() != nil || s.Generation() != 0 {
				t.Error("fixture server has a fleet or generation")
			}
		})
	}
}

func TestServeFixtureBytes(t *testing.T) {
	body := []byte(`{"machines": []}` + "\n")
	s, url := start(t, Options{Fixture: body})
	body[0] = 'X' // the server kept its own copy
	if _, got := get(t, http.MethodGet, url+"/machines/status"); string(got) != "{\"machines\": []}\n" {
		t.Errorf("body %q", got)
	}
	// SetFleet switches to fleet mode.
	f := mustGenerate(t, FleetSpec{Hosts: 2})
	if err := s.SetFleet(f); err != nil {
		t.Fatal(err)
	}
	st := status(t, client(t, url, matclient.Config{}))
	if st.Counts().Machines != 2 || st.Generation != 1 || s.Generation() != 1 {
		t.Errorf("after SetFleet: %+v generation %d", st.Counts(), st.Generation)
	}
}

func TestRoutes(t *testing.T) {
	s, url := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 1})})
	for _, tt := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/machines/status", 200},
		{http.MethodHead, "/machines/status", 200},
		{http.MethodGet, "/", 404},
		{http.MethodGet, "/machines", 404},
		{http.MethodGet, "/machines/status/x", 404},
		{http.MethodGet, "/racks/status", 404},
		{http.MethodGet, "/redfish/v1", 404},
		{http.MethodPost, "/machines/status", 405},
	} {
		if code, _ := get(t, tt.method, url+tt.path); code != tt.code {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.path, code, tt.code)
		}
	}
	if n := s.Requests(); n != 2 {
		t.Errorf("Requests = %d, want 2 (status GET and HEAD only)", n)
	}
}

// TestFaultControl: with FaultControl, PUT /matsim/fault sets the fault
// of later status requests and GET reads it; an unknown mode is a 400
// naming the modes; without it the path is 404 and the fault stays.
func TestFaultControl(t *testing.T) {
	put := func(url, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, url+FaultPath, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	off, offURL := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 1})})
	if code, _ := put(offURL, "500"); code != 404 {
		t.Errorf("PUT %s without FaultControl = %d, want 404", FaultPath, code)
	}
	if off.Fault() != FaultNone {
		t.Errorf("fault set without FaultControl: %v", off.Fault())
	}

	s, url := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 1}), FaultControl: true})
	if code, body := put(url, "500"); code != 200 || !strings.Contains(body, "fault 500") {
		t.Errorf("PUT 500 = %d %q", code, body)
	}
	if code, _ := get(t, http.MethodGet, url+"/machines/status"); code != 500 {
		t.Errorf("status after PUT 500 = %d, want 500", code)
	}
	if code, body := get(t, http.MethodGet, url+FaultPath); code != 200 || string(body) != "500\n" {
		t.Errorf("GET %s = %d %q, want 200 \"500\\n\"", FaultPath, code, body)
	}
	if code, body := put(url, "sometimes"); code != 400 || !strings.Contains(body, "none, 500, malformed, slow, hang") {
		t.Errorf("PUT of an unknown mode = %d %q, want 400 naming the modes", code, body)
	}
	if code, _ := put(url, strings.Repeat("x", 100)); code != 400 {
		t.Errorf("PUT of 100 bytes = %d, want 400", code)
	}
	if s.Fault() != Fault500 {
		t.Errorf("a refused PUT changed the fault: %v", s.Fault())
	}
	if code, body := put(url, "none\n"); code != 200 || !strings.Contains(body, "fault none") {
		t.Errorf("PUT none = %d %q", code, body)
	}
	if code, _ := get(t, http.MethodGet, url+"/machines/status"); code != 200 {
		t.Errorf("status after PUT none = %d, want 200", code)
	}
	if code, _ := get(t, http.MethodPost, url+FaultPath); code != 405 {
		t.Errorf("POST %s = %d, want 405", FaultPath, code)
	}
}

func TestNewErrors(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 1})
	bad := f.Clone()
	bad.Machines = append(bad.Machines, bad.Machines[0]) // duplicate mat_id
	for name, opts := range map[string]Options{
		"nothing":        {},
		"fleet+fixture":  {Fleet: f, Fixture: []byte("{}")},
		"missing file":   {FixturePath: filepath.Join(t.TempDir(), "nope.json")},
		"invalid fleet":  {Fleet: bad},
		"negative delay": {Fleet: f, SlowDelay: -time.Second},
	} {
		if s, err := New(opts); err == nil {
			_ = s.Close()
			t.Errorf("%s: New succeeded", name)
		}
	}
	s, err := New(Options{Fleet: f})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetFleet(bad); err == nil {
		t.Error("SetFleet accepted a fleet with duplicate mat_ids")
	}
	_ = s.Close()
}

func TestChurnAndGeneration(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 4, DPUsPerHost: 2, Switches: 1, PowerShelves: 1, Seed: 3})
	s, url := start(t, Options{Fleet: f})
	c := client(t, url, matclient.Config{})
	host0, host1, host2 := f.Machines[0], f.Machines[1], f.Machines[2]
	sw, shelf := f.Machines[4], f.Machines[5]

	steps := []struct {
		name    string
		do      func() error
		wantGen uint64
		check   func(t *testing.T, st *matclient.Status)
	}{
		{"first poll", func() error { return nil }, 1, nil},
		{"bmc ip change", func() error { return s.SetBMCIP(host0.MatID, "10.96.100.1") }, 1,
			func(t *testing.T, st *matclient.Status) {
				if st.Machines[0].BMC.IP != "10.96.100.1" {
					t.Errorf("ip %s", st.Machines[0].BMC.IP)
				}
			}},
		{"bmc ip cleared", func() error { return s.SetBMCIP(host0.DPUs[0].MatID, "") }, 1,
			func(t *testing.T, st *matclient.Status) {
				if st.Machines[0].DPUs[0].BMC.IP != "" || st.Counts().WithBMCIP != f.BMCs()-1 || s.BMCs() != f.BMCs()-1 {
					t.Errorf("dpu ip %q, %d with IP", st.Machines[0].DPUs[0].BMC.IP, st.Counts().WithBMCIP)
				}
			}},
		{"duplicate bmc ip allowed", func() error { return s.SetBMCIP(host2.MatID, host1.BMC.IP) }, 1,
			func(t *testing.T, st *matclient.Status) {
				if st.Machines[2].BMC.IP != st.Machines[1].BMC.IP {
					t.Error("duplicate IP not served")
				}
			}},
		{"dpu removed: no bump", func() error { return s.RemoveDevice(host1.DPUs[1].MatID) }, 1,
			func(t *testing.T, st *matclient.Status) {
				if len(st.Machines[1].DPUs) != 1 || st.Machines[1].DPUs[0].MatID != host1.DPUs[0].MatID {
					t.Errorf("dpus %+v", st.Machines[1].DPUs)
				}
			}},
		{"switch and shelf removed: no bump", func() error {
			return errors.Join(s.RemoveDevice(sw.MatID), s.RemoveDevice(shelf.MatID))
		}, 1, func(t *testing.T, st *matclient.Status) {
			if st.Counts().Switches != 0 || st.Counts().PowerShelves != 0 {
				t.Errorf("counts %+v", st.Counts())
			}
		}},
		{"host removed: bump", func() error { return s.RemoveDevice(host0.MatID) }, 2,
			func(t *testing.T, st *matclient.Status) {
				if len(st.Machines) != 3 || st.Machines[0].MatID != host1.MatID {
					t.Errorf("machines %d first %s", len(st.Machines), st.Machines[0].MatID)
				}
				if s.Devices() != 3+2+1+2 { // host1 lost a DPU
					t.Errorf("Devices %d", s.Devices())
				}
			}},
		{"no change: no bump", func() error { return nil }, 2, nil},
		{"two host changes between polls: one bump", func() error {
			return errors.Join(s.RemoveDevice(host1.MatID), s.RemoveDevice(host2.MatID))
		}, 3, nil},
		{"new fleet: one bump", func() error {
			return s.SetFleet(mustGenerate(t, FleetSpec{Hosts: 2, Seed: 99}))
		}, 4, func(t *testing.T, st *matclient.Status) {
			if len(st.Machines) != 2 {
				t.Errorf("machines %d", len(st.Machines))
			}
		}},
	}
	for _, step := range steps {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		st := status(t, c)
		if st.Generation != step.wantGen || s.Generation() != step.wantGen {
			t.Errorf("%s: generation %d (server %d), want %d", step.name, st.Generation, s.Generation(), step.wantGen)
		}
		if step.check != nil {
			step.check(t, st)
		}
	}

	if err := s.RemoveDevice("no-such-id"); !errors.Is(err, ErrUnknownDevice) {
		t.Errorf("RemoveDevice(unknown) = %v", err)
	}
	if err := s.SetBMCIP("no-such-id", "10.0.0.1"); !errors.Is(err, ErrUnknownDevice) {
		t.Errorf("SetBMCIP(unknown) = %v", err)
	}
	for _, ip := range []string{"fd00::1", "10.0.0", "x", "10.0.0.1/32"} {
		if err := s.SetBMCIP(s.Fleet().Machines[0].MatID, ip); err == nil {
			t.Errorf("SetBMCIP(%q) accepted", ip)
		}
	}
	// Fleet() is a copy.
	snap := s.Fleet()
	snap.Machines[0].MatID = "changed"
	if s.Fleet().Machines[0].MatID == "changed" {
		t.Error("Fleet() returned shared memory")
	}
}

func TestFaults(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 2, DPUsPerHost: 1})
	s, url := start(t, Options{Fleet: f, SlowDelay: 300 * time.Millisecond})
	c := client(t, url, matclient.Config{Timeout: 2 * time.Second})
	short := client(t, url, matclient.Config{Timeout: 100 * time.Millisecond})

	type result struct {
		ok        bool
		transient bool
		is        error
	}
	tests := []struct {
		fault   FaultMode
		client  *matclient.Client
		want    result
		minTime time.Duration
		check   func(t *testing.T, err error)
	}{
		{FaultNone, c, result{ok: true}, 0, nil},
		{Fault500, c, result{transient: true}, 0, func(t *testing.T, err error) {
			var he *matclient.HTTPError
			if !errors.As(err, &he) || he.StatusCode != 500 || !strings.Contains(he.Body, "injected fault") {
				t.Errorf("error %v, want HTTPError 500", err)
			}
		}},
		{FaultMalformed, c, result{is: matclient.ErrInvalidStatus}, 0, func(t *testing.T, err error) {
			if !strings.Contains(err.Error(), "unexpected end of JSON input") {
				t.Errorf("error %v, want truncated JSON", err)
			}
		}},
		{FaultSlow, c, result{ok: true}, 300 * time.Millisecond, nil},
		{FaultSlow, short, result{transient: true, is: context.DeadlineExceeded}, 100 * time.Millisecond, nil},
		{FaultHang, short, result{transient: true, is: context.DeadlineExceeded}, 100 * time.Millisecond, nil},
		{FaultNone, c, result{ok: true}, 0, nil},
	}
	for i, tt := range tests {
		s.SetFault(tt.fault)
		before := s.Requests()
		start := time.Now()
		st, err := tt.client.Status(context.Background())
		elapsed := time.Since(start)
		if got := s.Requests() - before; got != 1 {
			t.Errorf("%d %v: %d requests counted", i, tt.fault, got)
		}
		if elapsed < tt.minTime {
			t.Errorf("%d %v: answered after %v, want >= %v", i, tt.fault, elapsed, tt.minTime)
		}
		if tt.want.ok {
			if err != nil || st.Counts().Total() != 4 {
				t.Errorf("%d %v: Status = %v", i, tt.fault, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%d %v: Status succeeded", i, tt.fault)
			continue
		}
		if matclient.IsTransient(err) != tt.want.transient {
			t.Errorf("%d %v: IsTransient(%v) = %v", i, tt.fault, err, !tt.want.transient)
		}
		if tt.want.is != nil && !errors.Is(err, tt.want.is) {
			t.Errorf("%d %v: error %v is not %v", i, tt.fault, err, tt.want.is)
		}
		if tt.check != nil {
			tt.check(t, err)
		}
	}
}

func TestParseFaultMode(t *testing.T) {
	for _, m := range []FaultMode{FaultNone, Fault500, FaultMalformed, FaultSlow, FaultHang} {
		got, err := ParseFaultMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseFaultMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if m, err := ParseFaultMode(" HANG "); err != nil || m != FaultHang {
		t.Errorf("ParseFaultMode(HANG) = %v, %v", m, err)
	}
	if _, err := ParseFaultMode("explode"); err == nil {
		t.Error("ParseFaultMode accepted nonsense")
	}
	if s := FaultMode(42).String(); s != "FaultMode(42)" {
		t.Errorf("String = %q", s)
	}
}

func TestHTTPS(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 1, DPUsPerHost: 1})
	s, url := start(t, Options{Fleet: f, TLS: true, TLSNames: []string{"mat-0.mat.svc", "10.1.2.3"}})
	if !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Fatalf("url %q", url)
	}
	cert := s.Certificate()
	if cert == nil || !cert.IsCA || cert.VerifyHostname("mat-0.mat.svc") != nil || cert.VerifyHostname("10.1.2.3") != nil ||
		cert.VerifyHostname("localhost") != nil || cert.VerifyHostname("127.0.0.1") != nil {
		t.Fatalf("certificate names: %v %v", cert.DNSNames, cert.IPAddresses)
	}
	if cert.PublicKeyAlgorithm.String() != "ECDSA" {
		t.Errorf("key algorithm %v", cert.PublicKeyAlgorithm)
	}

	t.Run("insecure skip verify", func(t *testing.T) {
		st := status(t, client(t, url, matclient.Config{InsecureSkipVerify: true}))
		if st.Counts().Total() != 2 {
			t.Errorf("counts %+v", st.Counts())
		}
	})
	t.Run("verified with the server's pool", func(t *testing.T) {
		status(t, client(t, url, matclient.Config{RootCAs: s.CertPool()}))
	})
	t.Run("unverified fails permanently", func(t *testing.T) {
		_, err := client(t, url, matclient.Config{}).Status(context.Background())
		if err == nil || matclient.IsTransient(err) {
			t.Errorf("Status = %v, want a permanent certificate error", err)
		}
	})
	t.Run("plain http to https server fails", func(t *testing.T) {
		_, err := client(t, strings.Replace(url, "https://", "http://", 1), matclient.Config{}).Status(context.Background())
		if err == nil {
			t.Error("plain HTTP succeeded")
		}
	})
	plain, _ := start(t, Options{Fleet: f})
	if plain.Certificate() != nil || plain.CertPool() != nil {
		t.Error("plain server has a certificate")
	}
}

func TestConnectionCounter(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[tls], func(t *testing.T) {
			s, url := start(t, Options{Fleet: mustGenerate(t, FleetSpec{Hosts: 3, DPUsPerHost: 1}), TLS: tls})
			c := client(t, url, matclient.Config{InsecureSkipVerify: true})
			for range 20 {
				status(t, c)
			}
			if s.Connections() != 1 || s.Requests() != 20 {
				t.Errorf("one client, 20 calls: %d connections, %d requests; want 1, 20", s.Connections(), s.Requests())
			}
			// A fresh client per call (closed after) costs one connection each.
			for range 3 {
				c2, err := matclient.New(url, matclient.Config{InsecureSkipVerify: true})
				if err != nil {
					t.Fatal(err)
				}
				status(t, c2)
				_ = c2.Close()
			}
			if s.Connections() != 4 || s.Requests() != 23 {
				t.Errorf("after 3 fresh clients: %d connections, %d requests; want 4, 23", s.Connections(), s.Requests())
			}
		})
	}
}

func TestStartAndClose(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 1})

	t.Run("twice", func(t *testing.T) {
		s, _ := start(t, Options{Fleet: f})
		if _, err := s.Start(context.Background(), "127.0.0.1:0"); !errors.Is(err, ErrStarted) {
			t.Errorf("second Start = %v", err)
		}
	})
	t.Run("bad address", func(t *testing.T) {
		s, err := New(Options{Fleet: f})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Start(context.Background(), "256.0.0.1:99999"); err == nil {
			t.Error("Start on a bad address succeeded")
		}
	})
	t.Run("close is idempotent and final", func(t *testing.T) {
		s, err := New(Options{Fleet: f})
		if err != nil {
			t.Fatal(err)
		}
		url, err := s.Start(context.Background(), "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		status(t, client(t, url, matclient.Config{}))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close = %v", err)
		}
		if _, err := s.Start(context.Background(), "127.0.0.1:0"); !errors.Is(err, ErrServerClosed) {
			t.Errorf("Start after Close = %v", err)
		}
		if _, err := client(t, url, matclient.Config{Timeout: time.Second}).Status(context.Background()); err == nil || !matclient.IsTransient(err) {
			t.Errorf("Status after Close = %v, want a transient network error", err)
		}
	})
	t.Run("context cancel stops the server", func(t *testing.T) {
		s, err := New(Options{Fleet: f})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		url, err := s.Start(ctx, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c := client(t, url, matclient.Config{Timeout: time.Second})
		status(t, c)
		cancel()
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := c.Status(context.Background())
			if err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("server still serving after its context ended")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close after cancel = %v", err)
		}
	})
	t.Run("close ends hanging requests", func(t *testing.T) {
		s, err := New(Options{Fleet: f})
		if err != nil {
			t.Fatal(err)
		}
		url, err := s.Start(context.Background(), "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.SetFault(FaultHang)
		c := client(t, url, matclient.Config{Timeout: time.Minute})
		done := make(chan error, 1)
		go func() {
			_, err := c.Status(context.Background())
			done <- err
		}()
		for s.Requests() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		start := time.Now()
		if err := s.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("Close took %v with a hanging request", el)
		}
		select {
		case err := <-done:
			if err == nil {
				t.Error("hanging request succeeded")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("hanging request not ended by Close")
		}
	})
	t.Run("close without start", func(t *testing.T) {
		s, err := New(Options{Fleet: f})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
}

// TestRestart: a restarted server answers under the new epoch with
// generation 1 and the inventory it was given (empty first), and bumps the
// generation as that inventory grows back.
func TestRestart(t *testing.T) {
	f := mustGenerate(t, FleetSpec{Hosts: 3, Seed: 5})
	s, url := start(t, Options{Fleet: f, EpochID: "2026-08-21T19:04:05.000000001Z"})
	c := client(t, url, matclient.Config{})
	if err := s.SetFleet(&Fleet{InventoryID: f.InventoryID, Machines: f.Machines[:1]}); err != nil {
		t.Fatal(err)
	}
	if st := status(t, c); st.Generation != 2 {
		t.Fatalf("generation %d before the restart, want 2", st.Generation)
	}
	if err := s.Restart("2026-08-21T20:00:00.000000002Z", &Fleet{InventoryID: f.InventoryID}); err != nil {
		t.Fatal(err)
	}
	st := status(t, c)
	if st.EpochID != "2026-08-21T20:00:00.000000002Z" || st.Generation != 1 || len(st.Machines) != 0 {
		t.Errorf("after the restart: epoch %q generation %d, %d machines; want the new epoch, 1, none", st.EpochID, st.Generation, len(st.Machines))
	}
	if err := s.SetFleet(f); err != nil {
		t.Fatal(err)
	}
	st = status(t, c)
	if st.EpochID != "2026-08-21T20:00:00.000000002Z" || st.Generation != 2 || len(st.Machines) != 3 {
		t.Errorf("registered again: epoch %q generation %d, %d machines", st.EpochID, st.Generation, len(st.Machines))
	}
	if err := s.Restart("", &Fleet{Machines: []matclient.Device{{}}}); err == nil {
		t.Error("Restart with an invalid fleet: no error")
	}
}
