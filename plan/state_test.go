package plan

import (
	"testing"

	"github.com/matbus/matbus/matclient"
)

// TestDiffStateAnnotations: with state annotations off, a Service that
// carries them is updated once to drop them (foreign annotations kept), and
// later power flips plan nothing; switched on, they come back.
func TestDiffStateAnnotations(t *testing.T) {
	on := testOptions(IPModeClusterIP)
	on.StateAnnotations = true
	api := deployed(t, "v2-mixed.json", testInstance(), on)
	const host = "mat-bmc-host-7ec7b7c3-126-c030b365"
	s := api.svcs[host]
	s.Annotations["example.com/owner"] = "team-a"

	off := testOptions(IPModeClusterIP)
	st := loadStatus(t, "v2-mixed.json")
	p := Diff(Build(testInstance(), st, off), api.list(), off)
	if len(p.Create) != 0 || len(p.Recreate) != 0 || len(p.Delete) != 0 {
		t.Fatalf("plan %+v", summarize(p))
	}
	var withState int
	for _, svc := range api.list() {
		if _, ok := svc.Annotations[AnnotationPowerState]; ok {
			withState++
		}
	}
	if len(p.Update) != withState || withState == 0 {
		t.Fatalf("%d updates, want one per Service with state annotations (%d)", len(p.Update), withState)
	}
	for _, u := range p.Update {
		for _, k := range []string{AnnotationAPIState, AnnotationPowerState} {
			if _, ok := u.New.Annotations[k]; ok {
				t.Errorf("%s: %s kept", u.New.Name, k)
			}
		}
		if u.New.Annotations[AnnotationMatID] == "" || u.New.Annotations[AnnotationBMCIP] == "" && u.New.Annotations[AnnotationNVOSIP] == "" {
			t.Errorf("%s: other annotations lost: %v", u.New.Name, u.New.Annotations)
		}
		if u.New.Name == host && u.New.Annotations["example.com/owner"] != "team-a" {
			t.Errorf("%s: foreign annotation lost: %v", host, u.New.Annotations)
		}
	}
	api.apply(p)

	// Power flips and API state changes: nothing to write.
	st.Walk(func(d, _ *matclient.Device) { d.PowerState, d.APIState = "Off", "Assigned/Ready" })
	if p := Diff(Build(testInstance(), st, off), api.list(), off); !p.Empty() {
		t.Errorf("power flip with state annotations off: %+v", summarize(p))
	}
	p = Diff(Build(testInstance(), st, on), api.list(), on)
	if len(p.Update) != withState {
		t.Errorf("switched on: %d updates, want %d", len(p.Update), withState)
	}
}
