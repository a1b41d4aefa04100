package cliflag

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

func lookup(m map[string]string) Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestParseOrder: the command line wins over MATBUS_<FLAG>, which wins
// over the old controller's alias; an empty variable is unset except for
// the flags whose empty value turns a listener off.
func TestParseOrder(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		env        map[string]string
		addr, wait string
	}{
		{"defaults", nil, nil, ":8080", "5s"},
		{"alias", nil, map[string]string{"HEALTH_ADDR": ":1"}, ":1", "5s"},
		{"MATBUS_ name over alias", nil, map[string]string{"HEALTH_ADDR": ":1", "MATBUS_HEALTH_ADDR": ":2"}, ":2", "5s"},
		{"command line over both", []string{"--health-addr", ":3"}, map[string]string{"MATBUS_HEALTH_ADDR": ":2"}, ":3", "5s"},
		{"empty turns the listener off", nil, map[string]string{"MATBUS_HEALTH_ADDR": "", "HEALTH_ADDR": ":1"}, "", "5s"},
		{"empty duration is unset", nil, map[string]string{"MATBUS_WAIT": ""}, ":8080", "5s"},
		{"duration from env", nil, map[string]string{"MATBUS_WAIT": "1m"}, ":8080", "1m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := NewFlagSet("t", "")
			addr := fs.String("health-addr", ":8080", "")
			var wait time.Duration
			DurationVar(fs, &wait, "wait", 5*time.Second, "")
			if err := Parse(fs, tc.args, lookup(tc.env)); err != nil {
				t.Fatal(err)
			}
			if *addr != tc.addr || wait.String() != tc.wait {
				t.Errorf("health-addr %q, wait %v; want %q, %s", *addr, wait, tc.addr, tc.wait)
			}
		})
	}
}

// TestParseErrors: one line naming the flag (or the variable) and what is
// wanted; -h is a *HelpError wrapping flag.ErrHelp.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--wait", "soon"}, nil, `--wait "soon": want a positive duration`},
		{[]string{"--wait", "-1s"}, nil, `--wait "-1s": want a positive duration such as 30s or 1m (must be positive, got -1s)`},
		{[]string{"--off", "-1s"}, nil, `--off "-1s": want a duration such as 5m, or 0 for off (must not be negative`},
		{[]string{"--n", "x"}, nil, `--n "x": want an integer`},
		{[]string{"--nope"}, nil, "unknown flag --nope"},
		{[]string{"--n"}, nil, "flag --n needs a value"},
		{[]string{"stray"}, nil, `unexpected argument "stray"`},
		{nil, map[string]string{"MATBUS_N": "many"}, `environment variable MATBUS_N: --n "many": want an integer`},
	} {
		fs := NewFlagSet("t", "")
		var wait, off time.Duration
		DurationVar(fs, &wait, "wait", time.Second, "")
		OffDurationVar(fs, &off, "off", time.Second, "")
		fs.Int("n", 1, "")
		err := Parse(fs, tc.args, lookup(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want %q", tc.args, tc.env, err, tc.want)
		}
	}
	fs := NewFlagSet("t", "")
	var help *HelpError
	if err := Parse(fs, []string{"-h"}, lookup(nil)); !errors.As(err, &help) || !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want a *HelpError wrapping flag.ErrHelp", err)
	}
}

// TestLists: a List splits on commas and repeats; a GivenList says
// whether it was set at all, even to nothing.
func TestLists(t *testing.T) {
	fs := NewFlagSet("t", "")
	var l List
	var g GivenList
	fs.Var(&l, "l", "")
	fs.Var(&g, "g", "")
	if err := Parse(fs, []string{"--l", "a, b", "--l", "c,", "--g", ""}, lookup(nil)); err != nil {
		t.Fatal(err)
	}
	if l.String() != "a,b,c" || !g.Given || len(g.List) != 0 {
		t.Errorf("list %q, given %v %v; want a,b,c and a given empty list", l.String(), g.Given, g.List)
	}
}
