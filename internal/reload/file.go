package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultMinInterval is how long File.Get trusts its last look at the
// files before it looks again (one stat per file).
const DefaultMinInterval = time.Second

// Config describes the files of a File and how their contents become a T.
type Config[T any] struct {
	// Paths are the files read together, in the order Parse receives their
	// contents (one file for a CA bundle; certificate and key for a key
	// pair). Symbolic links are followed, so kubelet's swap of a mounted
	// Secret's `..data` link is a change.
	Paths []string
	// Name names the files in log lines, e.g. "--mat-ca-file /etc/mat-ca/ca.crt";
	// default: the first path.
	Name string
	// Parse validates the contents (data[i] is Paths[i]) and makes the
	// value. An error keeps the last good value; it must not quote the
	// contents.
	Parse func(data ...[]byte) (T, error)
	// MinInterval is how long Get trusts its last look before it looks at
	// the files again: 0 means DefaultMinInterval, negative looks on every
	// Get. Reload always looks.
	MinInterval time.Duration
	// Log receives one warning per bad state (a file missing, unreadable or
	// not parsable) and one info line per accepted change; nil logs
	// nothing.
	Log *slog.Logger
	// OnChange, if set, is called after a new value was accepted, outside
	// the File's lock.
	OnChange func()
}

// File holds the last good value parsed from one or more files and
// re-reads them when their identity changes: the device, inode, size or
// modification time of any of them, after following symbolic links. A
// change is noticed on use (Get, at most once per MinInterval, and Reload)
// and by Watch. Contents that cannot be read or parsed keep the last good
// value; each bad state is logged once (not once per look), and its end
// too. A file being written while it is read (its identity changes during
// the read) is read again at the next look. It is safe for concurrent use.
type File[T any] struct {
	cfg Config[T]

	mu      sync.Mutex
	val     T
	version uint64     // values accepted, 1 after Open
	good    []identity // identity of the files that gave val
	badID   []identity // identity of contents that did not parse
	badMsg  string     // the bad state last logged; "" when none
	looked  time.Time  // last look at the files
}

// Open reads and parses the files once and returns the File holding the
// value. Its error names the files (Config.Name) and wraps the read or
// parse error: a process should not start on a bad file.
func Open[T any](cfg Config[T]) (*File[T], error) {
	if len(cfg.Paths) == 0 || cfg.Parse == nil {
		return nil, errors.New("reload: Config needs Paths and Parse")
	}
	if cfg.Name == "" {
		cfg.Name = cfg.Paths[0]
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = DefaultMinInterval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	f := &File[T]{cfg: cfg}
	ids, data, err := f.read()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Name, err)
	}
	v, err := cfg.Parse(data...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Name, err)
	}
	f.val, f.good, f.version, f.looked = v, ids, 1, time.Now()
	return f, nil
}

// Name returns the name of the files in log lines (Config.Name).
func (f *File[T]) Name() string { return f.cfg.Name }

// Get returns the current value: the files are looked at first when the
// last look is older than MinInterval.
func (f *File[T]) Get() T {
	changed := false
	f.mu.Lock()
	if f.cfg.MinInterval < 0 || time.Since(f.looked) >= f.cfg.MinInterval {
		changed = f.lookLocked()
	}
	v := f.val
	f.mu.Unlock()
	f.changed(changed)
	return v
}

// Reload looks at the files now, whatever MinInterval, and reports whether
// a new value was accepted.
func (f *File[T]) Reload() bool {
	f.mu.Lock()
	changed := f.lookLocked()
	f.mu.Unlock()
	f.changed(changed)
	return changed
}

// Version counts the values accepted: 1 after Open, one more per change.
func (f *File[T]) Version() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.version
}

// Err returns the bad state of the files at the last look (missing,
// unreadable, not parsable), nil when they hold the value in use.
func (f *File[T]) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.badMsg == "" {
		return nil
	}
	return errors.New(f.badMsg)
}

// Watch looks at the files every interval until ctx ends, so that a
// change is taken (and a bad file logged) even while nothing uses the
// value. It returns when ctx ends.
func (f *File[T]) Watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.Reload()
		}
	}
}

func (f *File[T]) changed(changed bool) {
	if changed && f.cfg.OnChange != nil {
		f.cfg.OnChange()
	}
}

// lookLocked looks at the files and takes new contents that parse; it
// reports whether the value changed. Caller holds f.mu.
func (f *File[T]) lookLocked() bool {
	f.looked = time.Now()
	ids, err := identities(f.cfg.Paths)
	if err != nil {
		f.badLocked(err)
		return false
	}
	switch {
	case equal(ids, f.good):
		if f.badMsg != "" {
			f.badMsg = ""
			f.cfg.Log.Info("file readable again, contents unchanged", "file", f.cfg.Name)
		}
		return false
	case equal(ids, f.badID):
		return false // reported when it was read
	}
	readIDs, data, err := f.read()
	if err != nil {
		f.badLocked(err)
		return false
	}
	if !equal(readIDs, ids) {
		return false // being written: the next look reads it again
	}
	v, err := f.cfg.Parse(data...)
	if err != nil {
		f.badID = ids
		f.badLocked(err)
		return false
	}
	f.val, f.good, f.badID = v, ids, nil
	f.version++
	f.badMsg = ""
	f.cfg.Log.Info("file changed: new contents in use", "file", f.cfg.Name, "version", f.version)
	return true
}

// badLocked logs err once per bad state. Caller holds f.mu.
func (f *File[T]) badLocked(err error) {
	msg := err.Error()
	if msg == f.badMsg {
		return
	}
	f.badMsg = msg
	f.cfg.Log.Warn("file not usable, keeping its last good contents (logged once until it changes)", "file", f.cfg.Name, "error", msg)
}

// read reads every file and returns their identities as they were before
// the read; a file whose identity changed during the read gives
// identities that differ from a stat after it.
func (f *File[T]) read() ([]identity, [][]byte, error) {
	ids, err := identities(f.cfg.Paths)
	if err != nil {
		return nil, nil, err
	}
	data := make([][]byte, len(f.cfg.Paths))
	for i, p := range f.cfg.Paths {
		if data[i], err = os.ReadFile(p); err != nil {
			return nil, nil, err
		}
	}
	after, err := identities(f.cfg.Paths)
	if err != nil {
		return nil, nil, err
	}
	if !equal(ids, after) {
		return after, data, nil
	}
	return ids, data, nil
}

// identity is what tells one version of a file from another.
type identity struct {
	dev, ino uint64
	size     int64
	mtime    int64 // Unix nanoseconds
}

func identities(paths []string) ([]identity, error) {
	out := make([]identity, len(paths))
	for i, p := range paths {
		fi, err := os.Stat(p) // follows symbolic links: ..data swaps count
		if err != nil {
			return nil, err
		}
		if fi.IsDir() {
			return nil, fmt.Errorf("%s is a directory", p)
		}
		id := identity{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
		id.dev, id.ino = devIno(fi)
		out[i] = id
	}
	return out, nil
}

func equal(a, b []identity) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
