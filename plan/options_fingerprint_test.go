package plan

import "testing"

func TestFingerprint(t *testing.T) {
	base := Options{Namespace: "bmc", IPMode: IPModeClusterIP, TargetSelector: map[string]string{"a": "1", "b": "2"}, StateAnnotations: true}
	fp := base.Fingerprint()
	if len(fp) != 12 {
		t.Fatalf("fingerprint %q: want 12 hex digits", fp)
	}
	same := []Options{
		{Namespace: "bmc", IPMode: "", TargetSelector: map[string]string{"b": "2", "a": "1"}, StateAnnotations: true},
		{Namespace: "bmc", ManagedBy: DefaultManagedBy, IPMode: IPModeClusterIP, TargetSelector: map[string]string{"a": "1", "b": "2"}, StateAnnotations: true},
	}
	for i, o := range same {
		if got := o.Fingerprint(); got != fp {
			t.Errorf("same[%d]: fingerprint %s, want %s (writes the same Services)", i, got, fp)
		}
	}
	differ := map[string]func(*Options){
		"namespace":  func(o *Options) { o.Namespace = "other" },
		"managed-by": func(o *Options) { o.ManagedBy = "matbus" },
		"ip mode":    func(o *Options) { o.IPMode = IPModeExternalIP },
		"selector":   func(o *Options) { o.TargetSelector = map[string]string{"a": "1"} },
		"selector value": func(o *Options) {
			o.TargetSelector = map[string]string{"a": "1", "b": "3"}
		},
		"selector split": func(o *Options) {
			o.TargetSelector = map[string]string{"a": "1\"\nselector \"b\"=\"2"}
		},
		"state annotations": func(o *Options) { o.StateAnnotations = false },
	}
	for name, change := range differ {
		o := base
		change(&o)
		if got := o.Fingerprint(); got == fp {
			t.Errorf("%s changed: fingerprint unchanged %s", name, got)
		}
	}
}
