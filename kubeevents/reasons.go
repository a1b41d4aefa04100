package kubeevents

import corev1 "k8s.io/api/core/v1"

// Reason is the reason of a Kubernetes Event matbus records (CamelCase, as
// Kubernetes' own). Each has a fixed type (Normal or Warning) and action.
type Reason string

// Reasons on the MAT Service of an instance (the Service discovery watches).
const (
	// FetchFailed: the instance's status could not be fetched or decoded;
	// none of its Services changed.
	FetchFailed Reason = "FetchFailed"
	// OutOfRotation: consecutive failed fetches took the instance out of
	// rotation; it is probed at a growing interval (discovery).
	OutOfRotation Reason = "OutOfRotation"
	// Recovered: an instance out of rotation was fetched again (discovery).
	Recovered Reason = "Recovered"
	// InvalidDevices: the status has invalid devices; they get no Service
	// and no Service of the instance is deleted until it is valid again.
	InvalidDevices Reason = "InvalidDevices"
	// DuplicateBMCIP: devices report an IP another device reports; all but
	// one go without a Service.
	DuplicateBMCIP Reason = "DuplicateBMCIP"
	// NameCollision: a device's Service name is taken by another device's,
	// another instance's or another tool's Service.
	NameCollision Reason = "NameCollision"
	// DeletesHeld: many devices vanished from the status at once; their
	// Services' deletes are held for a confirmation window (worker).
	DeletesHeld Reason = "DeletesHeld"
	// DeletesReleased: the window of held deletes ended and the status
	// still lacks the devices; their Services are deleted (worker).
	DeletesReleased Reason = "DeletesReleased"
	// HoldResolved: a hold of deletes ended: the devices came back, their
	// Services were deleted after the window, or the instance is gone.
	HoldResolved Reason = "HoldResolved"
)

// Reasons on a BMC Service (on the MAT Service when the BMC Service does
// not exist).
const (
	// CreateRefused: the API server refused to create (or recreate) the
	// Service, permanently (403, 422, ...).
	CreateRefused Reason = "CreateRefused"
	// UpdateRefused: the API server refused to update the Service, permanently.
	UpdateRefused Reason = "UpdateRefused"
	// Recreated: the Service was deleted and created again for a new
	// cluster IP (spec.clusterIP is immutable).
	Recreated Reason = "Recreated"
	// Adopted: the old controller's Service got matbus's labels and
	// annotation and is matbus's from now on.
	Adopted Reason = "Adopted"
)

// Reasons lists every Reason.
var Reasons = []Reason{FetchFailed, OutOfRotation, Recovered, InvalidDevices, DuplicateBMCIP, NameCollision,
	DeletesHeld, DeletesReleased, HoldResolved, CreateRefused, UpdateRefused, Recreated, Adopted}

// Type returns the Event type of r: corev1.EventTypeNormal for Recovered,
// HoldResolved, Recreated and Adopted, corev1.EventTypeWarning otherwise.
func (r Reason) Type() string {
	switch r {
	case Recovered, HoldResolved, Recreated, Adopted:
		return corev1.EventTypeNormal
	}
	return corev1.EventTypeWarning
}

// Action returns what matbus was doing when r happened: Fetch, Schedule,
// Plan, Delete, Create, Update, Recreate or Adopt.
func (r Reason) Action() string {
	switch r {
	case FetchFailed:
		return "Fetch"
	case OutOfRotation, Recovered:
		return "Schedule"
	case DeletesHeld, DeletesReleased, HoldResolved:
		return "Delete"
	case CreateRefused:
		return "Create"
	case UpdateRefused:
		return "Update"
	case Recreated:
		return "Recreate"
	case Adopted:
		return "Adopt"
	}
	return "Plan"
}
