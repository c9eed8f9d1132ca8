package faults

import (
	"testing"

	"github.com/cheetahbroker/cheetah/history/historytest"
)

// emptyPostgres is an empty database on the test server (make postgres),
// dropped when the test ends; serve migrates it.
func emptyPostgres(t *testing.T) string { return historytest.EmptyPostgres(t) }
