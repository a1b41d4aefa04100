// Package kubewatch tells whether an informer can list and watch its
// resource: it observes every list and watch call (and direct lists of the
// same resource), keeps the failing verbs with their reasons for readiness,
// exports them (and the calls and delivered objects it counted) as
// metrics, and reports one error event when its calls start failing and
// one when list and watch work again. It never reads or changes objects
// itself.
package kubewatch
