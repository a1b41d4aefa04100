package worker_test

import (
	"slices"
	"testing"
	"time"

	"github.com/matbus/matbus/events"
	"github.com/matbus/matbus/matsim"
	"github.com/matbus/matbus/plan"
	"github.com/matbus/matbus/worker"
)

const nvosV2Mixed = "mat-nvos-1a530254-57f-964ececc" // switch 1a530254…, NVOS IP 10.98.0.20

// TestNVOSServiceLifecycle: a switch's NVOS Service on the real API server
// in both modes: created with its IP and the nmxc port, kept against a
// stale delete job while the status wants it, recreated when the NVOS IP
// changes (cluster-ip) or updated in place (external-ip), and deleted when
// the switch stops reporting an NVOS IP, while its BMC Service stays.
func TestNVOSServiceLifecycle(t *testing.T) {
	for _, mode := range []plan.IPMode{plan.IPModeClusterIP, plan.IPModeExternalIP} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			fleet := fixtureFleet(t, fixtureV2Mixed)
			sim := e.startSim(matsim.Options{Fleet: fleet})
			e.startDiscovery(e.entry("mat-a", sim.URL()))
			w := e.startWorker(workerOpts{Tweak: func(c *worker.Config) { c.Plan.IPMode = mode }})
			before := e.waitServices(v2MixedNames()...)

			ipOf := func(name string) string {
				s := e.service(name)
				if s == nil {
					return ""
				}
				if mode == plan.IPModeExternalIP {
					if len(s.Spec.ExternalIPs) != 1 {
						return ""
					}
					return s.Spec.ExternalIPs[0]
				}
				return s.Spec.ClusterIP
			}
			nv := before[nvosV2Mixed]
			if got := ipOf(nvosV2Mixed); got != "10.98.0.20" {
				t.Fatalf("NVOS Service IP %q, want 10.98.0.20", got)
			}
			if len(nv.Spec.Ports) != 1 || nv.Spec.Ports[0].Name != "nmxc" || nv.Spec.Ports[0].Port != 9370 ||
				nv.Spec.Ports[0].TargetPort.IntVal != 1266 || nv.Labels[plan.LabelMachineType] != "nvos" {
				t.Fatalf("NVOS Service %+v %+v", nv.Labels, nv.Spec.Ports)
			}

			// A stale delete job with the current UID: the newest status still wants it.
			job := events.DeleteJob{Key: e.key("mat-a"), Namespace: e.ns, Name: nv.Name, UID: string(nv.UID),
				MatID: nv.Annotations[plan.AnnotationMatID], Reason: "stale", PlannedAt: time.Now().Add(-time.Minute)}
			if err := e.bus.Publish(e.ctx, e.bus.Subjects().Delete(job.Key), events.TypeDeleteJob, "test-stale-nvos", job); err != nil {
				t.Fatal(err)
			}
			e.drainDeletes()
			if s := e.service(nvosV2Mixed); s == nil || s.UID != nv.UID {
				t.Fatal("the NVOS Service was deleted by a stale job although the status wants it")
			}
			if st := w.Stats(); st.DeletesKept != 1 {
				t.Errorf("stats = %+v, want one delete kept", st)
			}

			// A new NVOS IP.
			next := fleet.Clone()
			sw := &next.Machines[3]
			if sw.MatID != "1a530254-57f0-4a8d-adb9-7d5520153f50" {
				t.Fatalf("fixture order changed: machines[3] is %s", sw.MatID)
			}
			sw.NvosIP = "10.98.0.21"
			if err := sim.SetFleet(next); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the NVOS Service on 10.98.0.21", func() (bool, string) {
				ip := ipOf(nvosV2Mixed)
				return ip == "10.98.0.21", "ip " + ip
			})
			s := e.service(nvosV2Mixed)
			if recreated := s.UID != nv.UID; recreated != (mode == plan.IPModeClusterIP) {
				t.Errorf("UID %s -> %s: recreated = %v in %s mode", nv.UID, s.UID, recreated, mode)
			}
			if s.Annotations[plan.AnnotationNVOSIP] != "10.98.0.21" {
				t.Errorf("annotations %v", s.Annotations)
			}

			// No NVOS IP any more: the NVOS Service goes, the switch's BMC Service stays.
			next = next.Clone()
			next.Machines[3].NvosIP = ""
			if err := sim.SetFleet(next); err != nil {
				t.Fatal(err)
			}
			want := slices.DeleteFunc(v2MixedNames(), func(n string) bool { return n == nvosV2Mixed })
			after := e.waitServices(want...)
			for _, n := range want {
				if after[n].UID != before[n].UID {
					t.Errorf("%s was re-created", n)
				}
			}
			for _, kind := range []string{"create", "update", "delete", "plan"} {
				if evs := e.errs.Of(errKind(kind)); len(evs) != 0 {
					t.Errorf("unexpected %s error events: %+v", kind, evs)
				}
			}
		})
	}
}
