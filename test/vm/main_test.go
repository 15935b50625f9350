package vm_test

import (
	"os"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/test/vm"
)

// TestMain prints how long each scenario and each VM operation took, and
// the total: the budget of `make test-vm` is read off this report.
func TestMain(m *testing.M) {
	start := time.Now()
	code := m.Run()
	vm.Timings.Report(os.Stderr, time.Since(start))
	os.Exit(code)
}
