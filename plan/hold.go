package plan

import (
	"errors"
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DefaultHoldShare is the default HoldRule.Share: a status that takes
// away at least half of an instance's Services at once is a mass
// disappearance.
const DefaultHoldShare = 0.5

// DefaultHoldWindow is the default HoldRule.Window. A restarting MAT
// serves its status again before its inventory is back: first an empty
// one under a new epoch_id, then its expected machines as it registers
// them one by one (each through its own state machine, DHCP and mock BMC
// start-up), which for hundreds of machines takes seconds to minutes.
// Five minutes covers that with a margin, and is the Kubernetes node
// lifecycle controller's default grace before it evicts from an
// unreachable node; a device that is really gone keeps a Service that
// reaches nothing for that long.
const DefaultHoldWindow = 5 * time.Minute

// HoldMinDeletes is the fewest deletes that the share and epoch rules
// hold: a single delete is the everyday case and is never held unless it
// takes an instance's last Service (the all rule).
const HoldMinDeletes = 2

// HoldRule is when the deletes of one status are a mass disappearance
// that is held for a confirmation window instead of executed. The zero
// value holds nothing.
type HoldRule struct {
	// Share is the fraction of an instance's Services (0 < Share <= 1)
	// that one status must take away at once, at least HoldMinDeletes of
	// them, to be held.
	Share float64
	// Window is how long held deletes wait, counted from the status that
	// started the hold; 0 turns holding off.
	Window time.Duration
}

// ErrInvalidHoldRule is wrapped by HoldRule.Validate.
var ErrInvalidHoldRule = errors.New("plan: invalid hold rule")

// Validate returns an error wrapping ErrInvalidHoldRule when Share is not
// in (0, 1] (NaN included) or Window is negative.
func (r HoldRule) Validate() error {
	if math.IsNaN(r.Share) || r.Share <= 0 || r.Share > 1 {
		return fmt.Errorf("%w: share %v is not in (0, 1]", ErrInvalidHoldRule, r.Share)
	}
	if r.Window < 0 {
		return fmt.Errorf("%w: negative window %v", ErrInvalidHoldRule, r.Window)
	}
	return nil
}

// Off reports whether r holds nothing (Window 0).
func (r HoldRule) Off() bool { return r.Window <= 0 }

// MassReason says why deletes are a mass disappearance.
type MassReason string

const (
	// MassNone: the deletes are not a mass disappearance.
	MassNone MassReason = ""
	// MassAll: the status takes away every Service of the instance (an
	// empty inventory, or none of the devices it had).
	MassAll MassReason = "all"
	// MassShare: the status takes away at least HoldRule.Share of the
	// instance's Services.
	MassShare MassReason = "share"
	// MassEpoch: the status comes under a new epoch_id (MAT restarted)
	// and takes away Services.
	MassEpoch MassReason = "epoch"
)

// Disappearance is what HoldRule.Mass looks at: how many Services of the
// instance exist and how many one status would delete, and the epochs.
type Disappearance struct {
	// Existing is the number of the instance's Services that a diff may
	// delete (see Deletable).
	Existing int
	// Deletes is the number the status would delete (len(Plan.Delete)).
	Deletes int
	// Epoch is the status's epoch_id; PrevEpoch that of the instance's
	// previous status, "" when unknown (the epoch rule then does not
	// apply).
	Epoch, PrevEpoch string
}

// Mass returns why the deletes of d are a mass disappearance under r, and
// a human-readable detail, or MassNone when they are not or r is off.
// Checked in this order:
//
//   - MassAll: every Service of the instance would go (Deletes >=
//     Existing > 0), whatever the instance's size;
//   - MassShare: at least HoldMinDeletes deletes, and Deletes >= Share ×
//     Existing;
//   - MassEpoch: at least HoldMinDeletes deletes under an epoch_id other
//     than a known PrevEpoch.
func (r HoldRule) Mass(d Disappearance) (MassReason, string) {
	if r.Off() || d.Deletes <= 0 || d.Existing <= 0 {
		return MassNone, ""
	}
	switch {
	case d.Deletes >= d.Existing:
		return MassAll, fmt.Sprintf("the status lists none of the devices of the instance's %d Services", d.Existing)
	case d.Deletes >= HoldMinDeletes && float64(d.Deletes) >= r.Share*float64(d.Existing):
		return MassShare, fmt.Sprintf("the status lacks the devices of %d of the instance's %d Services (%.0f%%, at least %.0f%% is a mass disappearance)",
			d.Deletes, d.Existing, 100*float64(d.Deletes)/float64(d.Existing), 100*r.Share)
	case d.Deletes >= HoldMinDeletes && d.PrevEpoch != "" && d.Epoch != d.PrevEpoch:
		return MassEpoch, fmt.Sprintf("the status comes under a new epoch_id %q (was %q: MAT restarted) and lacks the devices of %d of the instance's %d Services",
			d.Epoch, d.PrevEpoch, d.Deletes, d.Existing)
	}
	return MassNone, ""
}

// Deletable counts the existing Services that Diff may delete for d: ours
// (opts' managed-by), of d's instance and pod, and not being deleted.
func Deletable(d Desired, existing []*corev1.Service, opts Options) int {
	managedBy := LabelValue(opts.managedBy())
	n := 0
	for _, s := range existing {
		if s == nil || opts.Namespace != "" && s.Namespace != "" && s.Namespace != opts.Namespace {
			continue
		}
		if s.DeletionTimestamp == nil && s.Labels[LabelManagedBy] == managedBy && inScope(s, d) {
			n++
		}
	}
	return n
}

// HoldState is the shared record of a hold in force for one instance,
// as DecideHold reads it.
type HoldState struct {
	// Since is when the hold started; Until when its window ends.
	Since, Until time.Time
	// Released is set once a status fetched at or after Until still lacked
	// the devices: their deletes went ahead, and the record stays until
	// they are done.
	Released bool
	// UIDs are the Services held; All is set when the record does not
	// list every one of them (then every delete of the instance is held).
	UIDs map[types.UID]bool
	All  bool
}

// NewHoldState returns the HoldState of a stored hold: its window, whether
// it was released, the UIDs it lists and whether that list is all of them.
func NewHoldState(since, until time.Time, released bool, uids []string, complete bool) *HoldState {
	h := &HoldState{Since: since, Until: until, Released: released, All: !complete, UIDs: make(map[types.UID]bool, len(uids))}
	for _, u := range uids {
		h.UIDs[types.UID(u)] = true
	}
	return h
}

// Holds reports whether h keeps the Service of uid from being deleted
// now: h is in force (not released) and lists uid or holds all.
func (h *HoldState) Holds(uid types.UID) bool {
	return h != nil && !h.Released && (h.All || h.UIDs[uid])
}

// HoldAction is what DecideHold asks of the shared hold record.
type HoldAction int

const (
	// HoldKeep: the record (or its absence) stays as it is.
	HoldKeep HoldAction = iota
	// HoldStart: create a record of a new hold of Decision.Held.
	HoldStart
	// HoldUpdate: the hold stays in force over Decision.Held (the set of
	// missing devices changed); Since and Until stay.
	HoldUpdate
	// HoldRelease: the window is over and the status still lacks the
	// devices: mark the record released; Decision.Go are deleted.
	HoldRelease
	// HoldEnd: remove the record: nothing is left to delete (the devices
	// came back, or their Services are gone).
	HoldEnd
)

// HoldDecision is DecideHold's answer.
type HoldDecision struct {
	Action HoldAction
	// Reason and Detail say why a new hold starts (HoldStart), or why
	// deletes outside a released record start another one.
	Reason MassReason
	Detail string
	// Held are the deletes kept back, Go the deletes to run; together
	// they are the plan's deletes, each sorted by name.
	Held, Go []*corev1.Service
}

// DecideHold decides, for the deletes of plan p (planned from a status
// fetched at fetchedAt), what a hold under rule r and the instance's
// current record h (nil: none) does:
//
//   - no record: if r.Mass(dis) is a mass disappearance, a new hold of
//     every delete starts (HoldStart), else every delete goes;
//   - a record in force: with no deletes left the hold ends (HoldEnd: the
//     devices came back); before Until every delete is held (HoldUpdate
//     when the set changed); at or after Until the record is released
//     and every delete goes (HoldRelease);
//   - a released record: its Services' deletes go; other deletes are
//     checked as without a record against the Services not released
//     (a new hold of them replaces the record, HoldStart); with no
//     deletes left the record is removed (HoldEnd).
//
// In every case, a delete whose Service holds a cluster IP that a create
// or recreate of p needs (cluster-ip mode) goes: another device has that
// IP now, so its old device is not coming back with it. With r off, every
// delete goes and a record in force is ended.
func DecideHold(r HoldRule, h *HoldState, p Plan, dis Disappearance, fetchedAt time.Time, mode IPMode) HoldDecision {
	var free, rest []*corev1.Service
	needed := map[string]bool{}
	if mode != IPModeExternalIP {
		for _, s := range p.Create {
			needed[s.Spec.ClusterIP] = true
		}
		for _, u := range p.Recreate {
			needed[u.New.Spec.ClusterIP] = true
		}
		delete(needed, "")
	}
	for _, s := range p.Delete {
		if needed[s.Spec.ClusterIP] {
			free = append(free, s)
		} else {
			rest = append(rest, s)
		}
	}
	goAll := HoldDecision{Go: p.Delete}
	switch {
	case r.Off():
		if h != nil {
			goAll.Action = HoldEnd
		}
		return goAll
	case h == nil:
		reason, detail := r.Mass(dis)
		if reason == MassNone || len(rest) == 0 {
			return goAll
		}
		return HoldDecision{Action: HoldStart, Reason: reason, Detail: detail, Held: rest, Go: free}
	case !h.Released:
		switch {
		case len(p.Delete) == 0:
			return HoldDecision{Action: HoldEnd}
		case !fetchedAt.Before(h.Until):
			return HoldDecision{Action: HoldRelease, Go: p.Delete}
		}
		d := HoldDecision{Held: rest, Go: free}
		if !sameUIDs(h, rest) {
			d.Action = HoldUpdate
		}
		if len(rest) == 0 {
			d.Action = HoldEnd
		}
		return d
	}
	// Released: the record's deletes go; others are judged afresh.
	if len(p.Delete) == 0 {
		return HoldDecision{Action: HoldEnd}
	}
	var fresh []*corev1.Service
	released := 0
	for _, s := range rest {
		if h.All || h.UIDs[s.UID] {
			released++
		} else {
			fresh = append(fresh, s)
		}
	}
	if len(fresh) == 0 {
		return goAll
	}
	dis.Existing -= released
	dis.Deletes = len(fresh)
	reason, detail := r.Mass(dis)
	if reason == MassNone {
		return goAll
	}
	keep := make(map[types.UID]bool, len(fresh))
	for _, s := range fresh {
		keep[s.UID] = true
	}
	var goes []*corev1.Service
	for _, s := range p.Delete {
		if !keep[s.UID] {
			goes = append(goes, s)
		}
	}
	return HoldDecision{Action: HoldStart, Reason: reason, Detail: detail, Held: fresh, Go: goes}
}

// sameUIDs reports whether h lists exactly the UIDs of svcs (a record
// that holds all never needs an update for its list).
func sameUIDs(h *HoldState, svcs []*corev1.Service) bool {
	if h.All {
		return true
	}
	if len(h.UIDs) != len(svcs) {
		return false
	}
	for _, s := range svcs {
		if !h.UIDs[s.UID] {
			return false
		}
	}
	return true
}
