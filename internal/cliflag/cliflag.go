package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
)

// oldNames are the polling controller's environment variables, kept where
// the meaning is the same; every other flag reads MATBUS_<FLAG>.
var oldNames = map[string]string{
	"namespace":            "NAMESPACE",
	"discovery-selector":   "DISCOVERY_SELECTOR",
	"sync-interval":        "SYNC_INTERVAL",
	"target-selector":      "TARGET_SELECTOR",
	"insecure-skip-verify": "INSECURE_SKIP_VERIFY",
	"log-level":            "LOG_LEVEL",
	"kubeconfig":           "KUBECONFIG",
}

// oldAliases are the newer old controller's variables of flags whose
// variable is MATBUS_<FLAG> (the chart and compose set those): each is read
// only when the MATBUS_ variable is not set.
var oldAliases = map[string]string{
	"source-list-addr":         "SOURCE_LIST_ADDR",
	"source-list-debounce":     "SOURCE_LIST_DEBOUNCE",
	"health-addr":              "HEALTH_ADDR",
	"health-stale-after":       "HEALTH_STALE_AFTER",
	"enable-state-annotations": "ENABLE_STATE_ANNOTATIONS",
}

// emptyDisables are the flags whose variable, set to the empty string, sets
// the flag to "" (the listener is off), as in the old controller. For every
// other flag an empty variable counts as unset.
var emptyDisables = map[string]bool{
	"source-list-addr": true,
	"health-addr":      true,
}

// EnvName returns the environment variable that sets flag name: an old
// controller's name of oldNames, else MATBUS_<NAME> (upper case, '-' → '_').
// Aliases are in EnvNames.
func EnvName(name string) string {
	if v, ok := oldNames[name]; ok {
		return v
	}
	return "MATBUS_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// EnvNames returns every environment variable that sets flag name, in
// precedence order: EnvName first, then the old controller's alias if the
// flag has one (e.g. [MATBUS_HEALTH_ADDR HEALTH_ADDR]). It has one or two
// elements.
func EnvNames(name string) []string {
	if a, ok := oldAliases[name]; ok {
		return []string{EnvName(name), a}
	}
	return []string{EnvName(name)}
}

// Lookup looks up an environment variable: its value and whether it is
// set at all (os.LookupEnv's contract).
type Lookup func(name string) (value string, ok bool)

// EnvValue returns the value flag name takes from the environment and the
// variable it came from, trying EnvNames in order; ok is false when none
// is set. An empty value counts as set only for emptyDisables flags; for
// the others it is skipped like an unset variable.
func EnvValue(name string, lookup Lookup) (value, from string, ok bool) {
	for _, n := range EnvNames(name) {
		v, set := lookup(n)
		if !set || (v == "" && !emptyDisables[name]) {
			continue
		}
		return v, n, true
	}
	return "", "", false
}

// NewFlagSet returns a flag set whose usage lists each flag's environment
// variable. The flag package prints nothing itself (its output is
// discarded): Parse turns -h/--help into a *HelpError, whose Usage the
// caller prints, and a parse error into one line naming the flag and the
// bad value. name is the matbus subcommand, e.g. "worker".
func NewFlagSet(name, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: matbus %s [flags]\n\n%s\n\n%s:\n", name, summary, envNote(fs))
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		sort.Strings(names)
		for _, n := range names {
			f := fs.Lookup(n)
			def := ""
			if f.DefValue != "" && f.DefValue != "[]" {
				def = fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(w, "  --%s  [env %s]\n      %s%s\n", n, strings.Join(EnvNames(n), " or "), f.Usage, def)
		}
	}
	return fs
}

// envNote is the heading of the flag list in usage: where values come from
// and in which order, and which empty variables turn a listener off (only
// those of fs's flags).
func envNote(fs *flag.FlagSet) string {
	var off []string
	for _, n := range []string{"health-addr", "source-list-addr"} {
		if fs.Lookup(n) != nil && emptyDisables[n] {
			off = append(off, "--"+n)
		}
	}
	note := "Flags (each also read from the environment variable shown; the command line wins,\n" +
		"then the first set variable of \"A or B\"; an empty variable counts as unset"
	if len(off) > 0 {
		note += ",\nbut an empty variable of " + strings.Join(off, " or ") + " turns that listener off"
	}
	return note + ")"
}

// HelpError is -h/--help on the command line: the caller prints Usage
// (matbus: to stdout, exit 0). It wraps flag.ErrHelp.
type HelpError struct{ fs *flag.FlagSet }

func (h *HelpError) Error() string { return flag.ErrHelp.Error() }
func (h *HelpError) Unwrap() error { return flag.ErrHelp }

// Usage writes the flag set's usage to w.
func (h *HelpError) Usage(w io.Writer) {
	h.fs.SetOutput(w)
	defer h.fs.SetOutput(io.Discard)
	h.fs.Usage()
}

var (
	invalidValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-(\S+): (.*)$`)
	undefined    = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	missingArg   = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
)

// flagError rewrites an error of fs.Parse into one line naming the flag
// and the bad value, e.g. `--jobs "abc": want an integer`.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if m := undefined.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("unknown flag --%s", m[1])
	}
	if m := missingArg.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("flag --%s needs a value", m[1])
	}
	m := invalidValue.FindStringSubmatch(msg)
	if m == nil {
		return err
	}
	value, name, cause := m[1], m[2], m[3]
	want := ""
	if f := fs.Lookup(name); f != nil {
		switch v := f.Value.(type) {
		case positiveDuration:
			want = "want a positive duration such as 30s or 1m"
			if v.zeroOK {
				want = "want a duration such as 5m, or 0 for off"
			}
		case givenDuration:
			want = "want a positive duration such as 30s or 1m"
		default:
			switch fmt.Sprintf("%T", f.Value) {
			case "*flag.intValue", "*flag.int64Value", "*flag.uintValue", "*flag.uint64Value":
				want = "want an integer"
			case "*flag.float64Value":
				want = "want a number"
			case "*flag.boolValue":
				want = "want true or false"
			case "*flag.durationValue":
				want = "want a duration such as 30s or 1m"
			}
		}
	}
	switch {
	case want != "" && (cause == "parse error" || cause == "value out of range"):
		if cause == "value out of range" {
			want += " in range"
		}
		return fmt.Errorf("--%s %q: %s", name, value, want)
	case want != "":
		return fmt.Errorf("--%s %q: %s (%s)", name, value, want, cause)
	default:
		return fmt.Errorf("--%s %q: %s", name, value, cause)
	}
}

// Parse parses args; every flag not given on the command line takes
// its value from the environment (EnvValue: EnvName, then the old
// controller's alias; an empty value is unset except for emptyDisables
// flags). It returns an error naming the variable when a value does not
// parse, a *HelpError for -h/--help, and a one-line usage error otherwise.
func Parse(fs *flag.FlagSet, args []string, lookup Lookup) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &HelpError{fs: fs}
		}
		return flagError(fs, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		v, from, ok := EnvValue(f.Name, lookup)
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("environment variable %s: %w", from,
				flagError(fs, fmt.Errorf("invalid value %q for flag -%s: %w", v, f.Name, e)))
		}
	})
	return err
}

// List is a repeatable string flag that also splits on commas.
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

// GivenList is a List that remembers whether it was set at all (even to
// an empty list).
type GivenList struct {
	List
	Given bool
}

func (g *GivenList) Set(v string) error { g.Given = true; return g.List.Set(v) }

func (l *List) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// positiveDuration is a duration flag that refuses values <= 0 (with
// zeroOK, only values < 0).
type positiveDuration struct {
	d      *time.Duration
	zeroOK bool
}

func (p positiveDuration) String() string {
	if p.d == nil {
		return ""
	}
	return p.d.String()
}
func (p positiveDuration) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("parse error") // flagError says what is wanted
	}
	if d < 0 && p.zeroOK {
		return fmt.Errorf("must not be negative, got %s", v)
	}
	if d <= 0 && !p.zeroOK {
		return fmt.Errorf("must be positive, got %s", v)
	}
	*p.d = d
	return nil
}

// DurationVar defines a duration flag that refuses values <= 0, with the
// wanted form in its parse error.
func DurationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(positiveDuration{d: p}, name, usage)
}

// OffDurationVar is DurationVar for a flag where 0 means "off": it
// refuses only negative values.
func OffDurationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(positiveDuration{d: p, zeroOK: true}, name, usage)
}

// givenDuration is a positiveDuration that records in *given whether it
// was set (on the command line or from the environment).
type givenDuration struct {
	positiveDuration
	given *bool
}

func (g givenDuration) Set(v string) error {
	if err := g.positiveDuration.Set(v); err != nil {
		return err
	}
	*g.given = true
	return nil
}

// GivenDurationVar is DurationVar for a flag whose default depends on
// whether it was set (see givenDuration).
func GivenDurationVar(fs *flag.FlagSet, p *time.Duration, given *bool, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(givenDuration{positiveDuration{d: p}, given}, name, usage)
}
