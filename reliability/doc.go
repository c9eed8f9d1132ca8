// Package reliability holds Cheetah's reliability and security suite (issue
// 7): faults, soak, linearizability, fuzzing and security probes, each in a
// package of its own below this one, and the fuzz targets for the HTTP JSON
// bodies and the state-report reconciler in reliability/fuzz. Every test
// runs in a quick mode inside `go test ./...`; `make soak`, `make chaos` and
// `make fuzz` run the long modes. docs/reliability.md lists every test and
// the figures of the last long run.
package reliability
