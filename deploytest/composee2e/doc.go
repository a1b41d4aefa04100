// Package composee2e runs docker-compose.yaml under a real container engine:
// `make compose-e2e` (hack/compose-e2e.sh) starts a private dockerd, builds
// the images and runs this package's test with MATBUS_COMPOSE_E2E=1. It never
// starts an engine itself; without that variable the test is skipped.
// docs/adr/0011-compose-e2e.md has the design.
package composee2e
