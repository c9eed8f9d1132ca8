// Package e2e tests the browser extension end to end: Debian's chromium,
// headless, with the extension from the zip that make extension builds,
// against a whole broker (server.Open on a real listener) and local pages.
// It drives the extension as a person and an application would: the options
// page, the SDK, the popup. It needs /usr/bin/chromium (make test installs
// it through scripts/ensure-chromium) and is skipped under go test -short.
package e2e
