package main

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/matbus/matbus/internal/cliflag"
)

// mapEnv is an cliflag.Lookup over m: a key present with "" is set but empty.
func mapEnv(m map[string]string) cliflag.Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestEnvNamesOldAliases: the newer old controller's variables are aliases
// after the MATBUS_ name; the other flags have one variable.
func TestEnvNamesOldAliases(t *testing.T) {
	for flag, want := range map[string][]string{
		"source-list-addr":         {"MATBUS_SOURCE_LIST_ADDR", "SOURCE_LIST_ADDR"},
		"source-list-debounce":     {"MATBUS_SOURCE_LIST_DEBOUNCE", "SOURCE_LIST_DEBOUNCE"},
		"health-addr":              {"MATBUS_HEALTH_ADDR", "HEALTH_ADDR"},
		"health-stale-after":       {"MATBUS_HEALTH_STALE_AFTER", "HEALTH_STALE_AFTER"},
		"enable-state-annotations": {"MATBUS_ENABLE_STATE_ANNOTATIONS", "ENABLE_STATE_ANNOTATIONS"},
		"nats-url":                 {"MATBUS_NATS_URL"},
		"namespace":                {"NAMESPACE"},
	} {
		if got := cliflag.EnvNames(flag); !slices.Equal(got, want) {
			t.Errorf("cliflag.EnvNames(%q) = %v, want %v", flag, got, want)
		}
		if got := cliflag.EnvName(flag); got != want[0] {
			t.Errorf("cliflag.EnvName(%q) = %q, want %q", flag, got, want[0])
		}
	}
}

// aliasFlags registers the flags with old aliases as discovery and worker
// do (discovery's own registration, plus --health-addr and
// --enable-state-annotations with their defaults).
type aliasFlags struct {
	d           discoveryOpts
	healthAddr  string
	annotations bool
	jobs        int
}

func newAliasFlags() (*flag.FlagSet, *aliasFlags) {
	fs := cliflag.NewFlagSet("t", "")
	a := &aliasFlags{}
	a.d.register(fs)
	fs.StringVar(&a.healthAddr, "health-addr", ":8080", "")
	fs.BoolVar(&a.annotations, "enable-state-annotations", true, "")
	fs.IntVar(&a.jobs, "jobs", 8, "")
	return fs, a
}

// TestEnvPrecedenceAndEmptyValues: command line, then MATBUS_<FLAG>, then
// the old name; a set but empty --health-addr or --source-list-addr
// variable turns the listener off (also when the MATBUS_ one is empty and
// the old one is not), while an empty variable of any other flag counts as
// unset.
func TestEnvPrecedenceAndEmptyValues(t *testing.T) {
	type want struct {
		health, sources string
		debounce, stale time.Duration
		annotations     bool
		jobs            int
	}
	def := want{":8080", "127.0.0.1:8090", 5 * time.Second, 10 * time.Minute, true, 8}
	with := func(f func(*want)) want { w := def; f(&w); return w }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want want
	}{
		{"nothing set", nil, nil, def},
		{"old names", nil, map[string]string{"HEALTH_ADDR": ":9000", "SOURCE_LIST_ADDR": ":8091", "SOURCE_LIST_DEBOUNCE": "2s",
			"HEALTH_STALE_AFTER": "20m", "ENABLE_STATE_ANNOTATIONS": "false"},
			want{":9000", ":8091", 2 * time.Second, 20 * time.Minute, false, 8}},
		{"MATBUS_ names win over old names", nil, map[string]string{"HEALTH_ADDR": ":9000", "MATBUS_HEALTH_ADDR": ":9001",
			"SOURCE_LIST_DEBOUNCE": "2s", "MATBUS_SOURCE_LIST_DEBOUNCE": "3s", "ENABLE_STATE_ANNOTATIONS": "false", "MATBUS_ENABLE_STATE_ANNOTATIONS": "true"},
			with(func(w *want) { w.health, w.debounce = ":9001", 3*time.Second })},
		{"command line wins over both", []string{"--health-addr", ":9002", "--source-list-debounce", "0s"},
			map[string]string{"HEALTH_ADDR": ":9000", "MATBUS_HEALTH_ADDR": ":9001", "SOURCE_LIST_DEBOUNCE": "2s"},
			with(func(w *want) { w.health, w.debounce = ":9002", 0 })},
		{"empty old names turn the listeners off", nil, map[string]string{"HEALTH_ADDR": "", "SOURCE_LIST_ADDR": ""},
			with(func(w *want) { w.health, w.sources = "", "" })},
		{"empty MATBUS_ names turn them off, old names unread", nil,
			map[string]string{"MATBUS_HEALTH_ADDR": "", "HEALTH_ADDR": ":9000", "MATBUS_SOURCE_LIST_ADDR": "", "SOURCE_LIST_ADDR": ":8091"},
			with(func(w *want) { w.health, w.sources = "", "" })},
		{"empty values of other flags are unset", nil, map[string]string{"MATBUS_SOURCE_LIST_DEBOUNCE": "", "SOURCE_LIST_DEBOUNCE": "2s",
			"HEALTH_STALE_AFTER": "", "ENABLE_STATE_ANNOTATIONS": "", "MATBUS_JOBS": ""},
			with(func(w *want) { w.debounce = 2 * time.Second })},
		{"an empty command-line value wins over the environment", []string{"--health-addr="}, map[string]string{"MATBUS_HEALTH_ADDR": ":9001"},
			with(func(w *want) { w.health = "" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, a := newAliasFlags()
			if err := cliflag.Parse(fs, tc.args, mapEnv(tc.env)); err != nil {
				t.Fatal(err)
			}
			got := want{a.healthAddr, a.d.sourceListAddr, a.d.sourceListDebounce, a.d.staleAfter, a.annotations, a.jobs}
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestEnvErrorNamesTheVariableRead: a bad value is reported under the
// variable it was read from, old name or MATBUS_ name.
func TestEnvErrorNamesTheVariableRead(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SOURCE_LIST_DEBOUNCE": "soon"}, `environment variable SOURCE_LIST_DEBOUNCE: --source-list-debounce "soon": want a duration`},
		{map[string]string{"MATBUS_HEALTH_STALE_AFTER": "-1m", "HEALTH_STALE_AFTER": "1m"}, `environment variable MATBUS_HEALTH_STALE_AFTER: --health-stale-after "-1m": want a positive duration`},
		{map[string]string{"ENABLE_STATE_ANNOTATIONS": "yes please"}, `environment variable ENABLE_STATE_ANNOTATIONS: --enable-state-annotations "yes please": want true or false`},
	} {
		fs, _ := newAliasFlags()
		err := cliflag.Parse(fs, nil, mapEnv(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.env, err, tc.want)
		}
	}
}

// TestEnvEmptyThroughOSLookupEnv: main's lookup (os.LookupEnv) tells a
// variable set to "" from an unset one.
func TestEnvEmptyThroughOSLookupEnv(t *testing.T) {
	t.Setenv("HEALTH_ADDR", "")
	t.Setenv("MATBUS_SOURCE_LIST_ADDR", "")
	t.Setenv("SOURCE_LIST_ADDR", ":8091")
	t.Setenv("SOURCE_LIST_DEBOUNCE", "")
	os.Unsetenv("MATBUS_HEALTH_ADDR")
	os.Unsetenv("MATBUS_SOURCE_LIST_DEBOUNCE")
	fs, a := newAliasFlags()
	if err := cliflag.Parse(fs, nil, os.LookupEnv); err != nil {
		t.Fatal(err)
	}
	if a.healthAddr != "" || a.d.sourceListAddr != "" || a.d.sourceListDebounce != 5*time.Second {
		t.Errorf("health %q, sources %q, debounce %s; want both off and the default debounce", a.healthAddr, a.d.sourceListAddr, a.d.sourceListDebounce)
	}
}

// TestHelpShowsOldAliases: `--help` of worker and discovery names both
// variables of an aliased flag, the MATBUS_ one first, and says in which
// order they are read.
func TestHelpShowsOldAliases(t *testing.T) {
	for sub, lines := range map[string][]string{
		"discovery": {"--health-addr  [env MATBUS_HEALTH_ADDR or HEALTH_ADDR]", "--source-list-addr  [env MATBUS_SOURCE_LIST_ADDR or SOURCE_LIST_ADDR]",
			"--source-list-debounce  [env MATBUS_SOURCE_LIST_DEBOUNCE or SOURCE_LIST_DEBOUNCE]",
			"--health-stale-after  [env MATBUS_HEALTH_STALE_AFTER or HEALTH_STALE_AFTER]", "--nats-url  [env MATBUS_NATS_URL]\n",
			`the command line wins,`, `then the first set variable of "A or B"`, "but an empty variable of --health-addr or --source-list-addr turns that listener off)"},
		"worker": {"--health-addr  [env MATBUS_HEALTH_ADDR or HEALTH_ADDR]",
			"--enable-state-annotations  [env MATBUS_ENABLE_STATE_ANNOTATIONS or ENABLE_STATE_ANNOTATIONS]", "--target-selector  [env TARGET_SELECTOR]\n",
			"but an empty variable of --health-addr turns that listener off)"},
		"matsim": {`an empty variable counts as unset)`},
	} {
		code, out, _ := runArgs(t, nil, sub, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d", sub, code)
		}
		for _, l := range lines {
			if !strings.Contains(out, l) {
				t.Errorf("%s --help lacks %q:\n%s", sub, l, out)
			}
		}
	}
}
