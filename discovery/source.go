package discovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/matbus/matbus/events"
)

// Source answers one question: which MAT instances exist now?
type Source interface {
	// Scope names the source; a publisher reports as gone only instances
	// that carry its own scope.
	Scope() string
	// Run watches for changes until ctx ends, calling notify (which never
	// blocks) after every change. It returns an error if it cannot start.
	Run(ctx context.Context, notify func()) error
	// Instances returns the current instances sorted by key, and whether
	// the source has synced (false: the answer is not yet complete and must
	// not be used to declare instances gone).
	Instances() ([]events.Instance, bool)
}

// StaticEntry is one instance of a static source, as written in a static
// file (YAML or JSON list) or a --static flag ("[namespace/]name=url").
type StaticEntry struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	URL       string `json:"url"`
	PodName   string `json:"pod_name,omitempty"`
	Owner     string `json:"owner,omitempty"`
}

// StaticSource is a fixed list of instances, for local runs and compose.
// It can be changed at run time with Set (tests, churn).
type StaticSource struct {
	scope   string
	changed chan struct{}

	mu  sync.Mutex
	cur []events.Instance
}

// NewStatic returns a static source named name (scope "static:<name>") with
// entries; it returns an error naming the first invalid entry (bad
// namespace or name, bad URL, duplicate key). An empty list is refused: a
// static source with no instances would report every instance gone.
func NewStatic(name string, entries []StaticEntry) (*StaticSource, error) {
	insts, err := staticInstances("static:"+name, entries)
	if err != nil {
		return nil, err
	}
	if len(insts) == 0 {
		return nil, fmt.Errorf("discovery: static source %q has no instances", name)
	}
	return &StaticSource{scope: "static:" + name, cur: insts, changed: make(chan struct{}, 1)}, nil
}

func staticInstances(scope string, entries []StaticEntry) ([]events.Instance, error) {
	seen := map[string]bool{}
	var out []events.Instance
	for i, e := range entries {
		if e.Namespace == "" {
			e.Namespace = "default"
		}
		key, err := events.Key(e.Namespace, e.Name)
		if err != nil {
			return nil, fmt.Errorf("discovery: static entry %d: %w", i, err)
		}
		if seen[key] {
			return nil, fmt.Errorf("discovery: static entry %d: duplicate instance %s", i, key)
		}
		seen[key] = true
		if err := events.ValidateURL(e.URL); err != nil {
			return nil, fmt.Errorf("discovery: static entry %d (%s): %w", i, key, err)
		}
		inst := events.Instance{Key: key, URL: e.URL, PodName: e.PodName, Owner: e.Owner, Scope: scope}
		b, _ := json.Marshal(inst)
		sum := sha256.Sum256(b)
		inst.Version = hex.EncodeToString(sum[:6])
		out = append(out, inst)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ParseStatic parses --static values: each "[namespace/]name=url",
// several separated by commas.
func ParseStatic(values []string) ([]StaticEntry, error) {
	var out []StaticEntry
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			id, url, ok := strings.Cut(item, "=")
			if !ok {
				return nil, fmt.Errorf("discovery: static instance %q: want [namespace/]name=url", item)
			}
			e := StaticEntry{Name: id, URL: url}
			if ns, n, ok := strings.Cut(id, "/"); ok {
				e.Namespace, e.Name = ns, n
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// LoadStaticFile reads a YAML or JSON list of StaticEntry.
func LoadStaticFile(path string) ([]StaticEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("discovery: static file: %w", err)
	}
	var out []StaticEntry
	if err := yaml.UnmarshalStrict(b, &out); err != nil {
		return nil, fmt.Errorf("discovery: static file %s: %w", path, err)
	}
	return out, nil
}

// Scope implements Source.
func (s *StaticSource) Scope() string { return s.scope }

// Run implements Source: it delivers changes made with Set.
func (s *StaticSource) Run(ctx context.Context, notify func()) error {
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.changed:
				notify()
			}
		}
	}()
	return nil
}

// Instances implements Source; a static source is always synced.
func (s *StaticSource) Instances() ([]events.Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]events.Instance(nil), s.cur...), true
}

// Set replaces the list (an empty list is allowed here: it is how a test or
// an operator removes every instance). It returns an error for invalid entries.
func (s *StaticSource) Set(entries []StaticEntry) error {
	insts, err := staticInstances(s.scope, entries)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cur = insts
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default: // a notification is already pending
	}
	return nil
}

// WaitSynced polls src every 100 ms until it has synced and returns its
// instances then (sorted by key, possibly none). src must be running (its
// Run called). Errors: ctx ends first (ctx.Err(), unwrapped).
func WaitSynced(ctx context.Context, src Source) ([]events.Instance, error) {
	for {
		if insts, ok := src.Instances(); ok {
			return insts, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
