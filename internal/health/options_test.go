package health

import (
	"flag"
	"testing"
)

// TestOptions: --profiling needs a listener.
func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{{nil, true}, {[]string{"--profiling"}, true}, {[]string{"--health-addr="}, true}, {[]string{"--health-addr=", "--profiling"}, false}} {
		var o Options
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%v: %v", tc.args, err)
		}
	}
}
