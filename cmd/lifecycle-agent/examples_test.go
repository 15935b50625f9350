package main

import (
	"testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/clitest"
)

// Every --help example's --param is one its driver takes.
func TestHelpExamplesTakeTheirParameters(t *testing.T) {
	clitest.CheckHelpExamples(t, newRootCmd(&env{}))
}
