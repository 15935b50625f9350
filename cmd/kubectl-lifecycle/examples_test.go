package main

import (
	"testing"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/clitest"
)

// Every --help example's --param is one its driver takes.
func TestHelpExamplesTakeTheirParameters(t *testing.T) {
	clitest.CheckHelpExamples(t, newRootCmd(&options{clock: clock.RealClock{}}))
}
