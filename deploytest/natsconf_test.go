package deploytest

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/matbus/matbus/events"
)

// The NATS files of deploy/nats/ as nats-server reads them; faulttest runs
// the pipeline on them (TestNATSPermissions*).

// natsUsers returns the users nats-server reads from deploy/nats/<conf>
// (with passwords from the environment), by name.
func natsUsers(t *testing.T, conf string) map[string]*server.User {
	t.Helper()
	for _, role := range []string{"DISCOVERY", "WORKER", "READER"} {
		t.Setenv("MATBUS_"+role+"_PASSWORD", "pw-"+role)
	}
	t.Setenv("NATS_SERVER_NAME", "nats-0")
	opts, err := server.ProcessConfigFile(filepath.Join(root, "deploy", "nats", conf))
	if err != nil {
		t.Fatalf("deploy/nats/%s: %v", conf, err)
	}
	out := map[string]*server.User{}
	for _, u := range opts.Users {
		out[u.Username] = u
	}
	return out
}

// TestNATSConfFiles: both server files carry the same three users in
// account MATBUS, with JetStream; their passwords come from the
// environment (not the literal text of a quoted variable).
func TestNATSConfFiles(t *testing.T) {
	single := natsUsers(t, "nats-server.conf")
	cluster := natsUsers(t, "nats-server-cluster.conf")
	if names := slices.Sorted(maps.Keys(single)); !slices.Equal(names, []string{"discovery", "reader", "worker"}) {
		t.Fatalf("users %v, want discovery, reader, worker", names)
	}
	for name, u := range single {
		if u.Password != "pw-"+strings.ToUpper(name) {
			t.Errorf("user %s: password %q is not $MATBUS_%s_PASSWORD", name, u.Password, strings.ToUpper(name))
		}
		if u.Account == nil || u.Account.Name != "MATBUS" {
			t.Errorf("user %s is not in account MATBUS", name)
		}
		c := cluster[name]
		if c == nil || !slices.Equal(c.Permissions.Publish.Allow, u.Permissions.Publish.Allow) ||
			!slices.Equal(c.Permissions.Subscribe.Allow, u.Permissions.Subscribe.Allow) {
			t.Errorf("user %s: the cluster file's permissions differ", name)
		}
	}
}

// TestNATSConfNeedsPasswords: nats-server refuses the files (-t, its
// configuration check) while a password variable is not set, naming it,
// and accepts them once all are.
func TestNATSConfNeedsPasswords(t *testing.T) {
	bin := natsServer(t)
	all := []string{"MATBUS_DISCOVERY_PASSWORD=d", "MATBUS_WORKER_PASSWORD=w", "MATBUS_READER_PASSWORD=r", "NATS_SERVER_NAME=nats-0"}
	for _, conf := range []string{"nats-server.conf", "nats-server-cluster.conf"} {
		path := filepath.Join(root, "deploy", "nats", conf)
		for i, kv := range all[:3] {
			env := append(slices.Clone(all[:i]), all[i+1:]...)
			cmd := exec.Command(bin, "-c", path, "-t")
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			name, _, _ := strings.Cut(kv, "=")
			if err == nil || !strings.Contains(string(out), name) {
				t.Errorf("%s without %s: %v\n%s", conf, name, err, out)
			}
		}
		cmd := exec.Command(bin, "-c", path, "-t")
		cmd.Env = all
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", conf, err, out)
		}
	}
}

// TestNATSLeastPrivilege: what each user may publish, by the server's own
// subject matching: only discovery sends instance events and sync jobs;
// the worker may not update the instances or sync stream (an update could
// map a subject it may publish onto them); the reader publishes nothing
// but read requests of the JetStream API and flow-control replies.
func TestNATSLeastPrivilege(t *testing.T) {
	users := natsUsers(t, "nats-server.conf")
	may := func(user, subject string) bool {
		for _, f := range users[user].Permissions.Publish.Allow {
			if server.SubjectMatchesFilter(subject, f) {
				return true
			}
		}
		return false
	}
	s := events.Subjects{}
	key := "team-a.mat-0"
	for _, c := range []struct {
		subject         string
		discovery, work bool
	}{
		{s.Instance(key), true, false},
		{s.Sync(key), true, false},
		{s.Cleanup(key), true, true},
		{s.Delete(key), false, true},
		{s.Result(key), false, true},
		{s.Error(events.ErrorFetch), true, true},
		{"$KV.MAT_STATE." + events.StateLeaderKey("team-a"), true, false},
		{"$KV.MAT_STATE." + events.StateInstanceKey(key), true, false},
		{"$KV.MAT_STATE.hold." + key, false, true},
		{"$JS.API.STREAM.UPDATE.MAT_INSTANCES", true, false},
		{"$JS.API.STREAM.UPDATE.MAT_SYNC", true, false},
		{"$JS.API.STREAM.DELETE.MAT_INSTANCES", false, false},
		{"$JS.API.STREAM.PURGE.MAT_INSTANCES", true, false},
		{"$JS.API.STREAM.MSG.DELETE.MAT_INSTANCES", false, false},
		{"$JS.API.CONSUMER.CREATE.MAT_SYNC.matbus-sync-team-a", false, true},
		{"$JS.ACK.MAT_SYNC.matbus-sync-team-a.1.2.3.4.5", false, true},
		{"$JS.API.STREAM.CREATE.OTHER", false, false},
		{"other.subject", false, false},
	} {
		if got := may("discovery", c.subject); got != c.discovery {
			t.Errorf("discovery may publish %s: %v, want %v", c.subject, got, c.discovery)
		}
		if got := may("worker", c.subject); got != c.work {
			t.Errorf("worker may publish %s: %v, want %v", c.subject, got, c.work)
		}
	}
	write := regexp.MustCompile(`\.(CREATE|UPDATE|DELETE|PURGE)\.`)
	for _, f := range users["reader"].Permissions.Publish.Allow {
		read := f == "$JS.API.INFO" || strings.HasPrefix(f, "$JS.API.") || strings.HasPrefix(f, "$JS.FC.")
		if !read {
			t.Errorf("reader may publish %s", f)
		}
		// Its only creates and deletes are of the ordered consumers of
		// its reads (error stream, state bucket).
		if write.MatchString(f) && !strings.HasPrefix(f, "$JS.API.CONSUMER.CREATE.MAT_ERRORS") && !strings.HasPrefix(f, "$JS.API.CONSUMER.DELETE.MAT_ERRORS") &&
			!strings.HasPrefix(f, "$JS.API.CONSUMER.CREATE.KV_MAT_STATE") && !strings.HasPrefix(f, "$JS.API.CONSUMER.DELETE.KV_MAT_STATE") {
			t.Errorf("reader may publish %s", f)
		}
	}
	for _, u := range users {
		for _, f := range append(slices.Clone(u.Permissions.Publish.Allow), u.Permissions.Subscribe.Allow...) {
			if f == ">" || f == "$JS.API.>" || f == "mat.>" {
				t.Errorf("user %s: %q is more than any part needs", u.Username, f)
			}
		}
	}
}

// TestNATSStreamNames: every stream and bucket the files name is one
// matbus uses under the default prefix, and the sed that deploy/nats
// documents for another prefix gives the names matbus uses under that one.
func TestNATSStreamNames(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"mat", "team-a"} {
		text := string(b)
		if prefix != "mat" {
			// sed -e 's/"mat\./"team-a./' -e 's/MAT_/TEAM_A_/g'
			text = strings.ReplaceAll(strings.ReplaceAll(text, `"mat.`, `"team-a.`), "MAT_", "TEAM_A_")
		}
		bus, err := events.New(&nats.Conn{}, events.Config{Prefix: prefix}, nil) // names only: never connected
		if err != nil {
			t.Fatal(err)
		}
		known := map[string]bool{"KV_" + bus.StateBucket(): true, bus.StateBucket(): true}
		for _, c := range bus.StreamConfigs() {
			known[c.Name] = true
		}
		// Stream and bucket names are the upper-case tokens with a "_"
		// (the API's verbs have none).
		n := 0
		for _, m := range regexp.MustCompile(`\.([A-Z0-9]+_[A-Z0-9_]+)\b`).FindAllStringSubmatch(text, -1) {
			n++
			if !known[m[1]] {
				t.Errorf("prefix %s: the files name %s, which matbus does not use", prefix, m[1])
			}
		}
		if n < 20 {
			t.Errorf("prefix %s: %d stream names found: the pattern misses them", prefix, n)
		}
		for _, m := range regexp.MustCompile(`"([a-z][a-z0-9-]*)\.(instances|jobs|errors|results)\.`).FindAllStringSubmatch(text, -1) {
			if m[1] != prefix {
				t.Errorf("prefix %s: subject %s", prefix, m[0])
			}
		}
	}
}

// TestNSCScript: deploy/nats/nsc.sh gives each user exactly the
// permissions accounts.conf gives it.
func TestNSCScript(t *testing.T) {
	users := natsUsers(t, "nats-server.conf")
	b, err := os.ReadFile(filepath.Join(root, "deploy", "nats", "nsc.sh"))
	if err != nil {
		t.Fatal(err)
	}
	arrays := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?ms)^(\w+)=\(\n(.*?)^\)`).FindAllStringSubmatch(string(b), -1) {
		for _, line := range strings.Split(m[2], "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			arrays[m[1]] = append(arrays[m[1]], strings.Trim(line, "'"))
		}
	}
	for name, u := range users {
		for _, c := range []struct {
			array string
			want  []string
		}{{name + "_pub", u.Permissions.Publish.Allow}, {name + "_sub", u.Permissions.Subscribe.Allow}} {
			got := slices.Sorted(slices.Values(arrays[c.array]))
			want := slices.Sorted(slices.Values(c.want))
			if !slices.Equal(got, want) {
				t.Errorf("nsc.sh %s = %v\nwant (accounts.conf) %v", c.array, got, want)
			}
		}
	}
	if len(arrays) != 2*len(users) {
		t.Errorf("nsc.sh has %d lists, want %d", len(arrays), 2*len(users))
	}
}
