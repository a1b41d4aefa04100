package operator

import (
	"bytes"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/matbus/matbus/plan"
)

func svc(name string, labels, ann map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: ann},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: ports}}
}

var redfish = corev1.ServicePort{Name: plan.PortRedfish, Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(1266)}

// TestFill: an old controller's Service that gets only the additions is an
// adoption (not a change); one that also gets a port is an update with the
// adoption flag; a Service of an instance whose label value changes is a
// plain update; creates, recreates and deletes count as changes.
func TestFill(t *testing.T) {
	mb := plan.DefaultManagedBy
	oldL := map[string]string{plan.LabelManagedBy: mb, plan.LabelMatID: "a"}
	adoptedL := map[string]string{plan.LabelManagedBy: mb, plan.LabelMatID: "a", plan.LabelInstance: "ns.mat", plan.LabelDeviceKind: "host"}
	ann := map[string]string{plan.AnnotationMatID: "a"}
	ssh := corev1.ServicePort{Name: plan.PortSSH, Protocol: corev1.ProtocolTCP, Port: 22, TargetPort: intstr.FromInt32(2222)}
	ours := map[string]string{plan.LabelManagedBy: mb, plan.LabelInstance: "ns.mat", plan.LabelMatID: "c"}
	p := plan.Plan{
		Create: []*corev1.Service{svc("mat-bmc-host-n", adoptedL, map[string]string{plan.AnnotationMatID: "n", plan.AnnotationBMCIP: "10.0.0.9"})},
		Update: []plan.Update{
			{Old: svc("mat-bmc-host-a", oldL, nil, redfish), New: svc("mat-bmc-host-a", adoptedL, ann, redfish)},
			{Old: svc("mat-bmc-host-b", oldL, nil, redfish), New: svc("mat-bmc-host-b", adoptedL, ann, redfish, ssh)},
			{Old: svc("mat-bmc-host-c", ours, map[string]string{plan.AnnotationBMCIP: "10.0.0.1"}, redfish),
				New: svc("mat-bmc-host-c", ours, map[string]string{plan.AnnotationBMCIP: "10.0.0.2"}, redfish)},
		},
		Delete: []*corev1.Service{svc("mat-bmc-host-d", ours, map[string]string{plan.AnnotationMatID: "d"})},
	}
	var ip InstancePlan
	ip.fill(plan.Desired{}, p, mb)
	if len(ip.Adopt) != 1 || ip.Adopt[0].Name != "mat-bmc-host-a" {
		t.Fatalf("adopt %+v, want mat-bmc-host-a only", ip.Adopt)
	}
	if len(ip.Update) != 2 || !ip.Update[0].Adopt || ip.Update[1].Adopt {
		t.Fatalf("update %+v, want b (adopt) and c", ip.Update)
	}
	if got := ip.Update[0].Fields; len(got) != 4 || got[3] != (FieldChange{Field: "port", Key: "ssh", Op: "add", New: "TCP 22->2222"}) {
		t.Errorf("b's fields %+v", got)
	}
	if got := ip.Update[1].Fields; len(got) != 1 || got[0] != (FieldChange{Field: "annotation", Key: plan.AnnotationBMCIP, Op: "change", Old: "10.0.0.1", New: "10.0.0.2"}) {
		t.Errorf("c's fields %+v", got)
	}
	if ip.Changes() != 4 || ip.Delete[0].MatID != "d" || ip.Create[0].IP != "10.0.0.9" || ip.Create[0].MachineType != "host" {
		t.Errorf("changes %d, create %+v, delete %+v", ip.Changes(), ip.Create, ip.Delete)
	}

	r := &Report{Namespace: "ns", IPMode: plan.IPModeClusterIP, Instances: []InstancePlan{ip}}
	r.count()
	if r.Changes != 4 || r.Adoptions != 1 || r.ExitCode() != 2 {
		t.Errorf("report: %d changes, %d adoptions, exit %d; want 4, 1, 2", r.Changes, r.Adoptions, r.ExitCode())
	}
	var b bytes.Buffer
	if err := WriteText(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"adopt     mat-bmc-host-a  +" + plan.LabelInstance + "=ns.mat, +" + plan.LabelDeviceKind + "=host, +" + plan.AnnotationMatID + "=a",
		"update    mat-bmc-host-b  (adopts the old controller's Service)",
		`+ port ssh: "TCP 22->2222"`,
		`~ annotation ` + plan.AnnotationBMCIP + `: "10.0.0.1" -> "10.0.0.2"`,
		"delete    mat-bmc-host-d  mat_id d",
		"4 changes: 1 creates, 2 updates, 0 recreates, 1 deletes; 1 adoptions",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}

	adoptOnly := &Report{Instances: []InstancePlan{{Key: "ns.mat", Adopt: ip.Adopt, Plan: &plan.Plan{}}}}
	adoptOnly.count()
	b.Reset()
	_ = WriteText(&b, adoptOnly)
	if adoptOnly.ExitCode() != 0 || !strings.Contains(b.String(), "\nno change (1 adoptions") {
		t.Errorf("adoptions only: exit %d\n%s", adoptOnly.ExitCode(), b.String())
	}
	failed := &Report{Instances: []InstancePlan{{Key: "ns.x", Error: "status fetch failed"}, ip}}
	failed.count()
	if failed.ExitCode() != 1 {
		t.Errorf("an instance error: exit %d, want 1", failed.ExitCode())
	}
}

// TestOneInstanceSingular: plan's and status's summaries say "1 instance",
// not "1 instances".
func TestOneInstanceSingular(t *testing.T) {
	r := &Report{Namespace: "ns", IPMode: plan.IPModeClusterIP, Instances: []InstancePlan{{Key: "ns.x", Error: "status fetch failed"}}}
	r.count()
	var b bytes.Buffer
	if err := WriteText(&b, r); err != nil {
		t.Fatal(err)
	}
	st := &Status{Namespace: "ns", Summary: Summary{Instances: 1, Services: 400, HeldDeletes: 400, HeldInstances: 1}}
	if err := WriteStatusText(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"0 Services listed, 1 instance\n", "; 1 instance could not be planned", "\n1 instance, 400 Services;",
		"held deletes: 400 Services of 1 instance whose"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "1 instances") {
		t.Errorf("text says \"1 instances\":\n%s", out)
	}
}
