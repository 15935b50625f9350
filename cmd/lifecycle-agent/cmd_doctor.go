package main

import (
	"context"

	"github.com/spf13/cobra"
)

func newDoctorCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check that this node is ready for the agent",
		Long: `Check the configuration, the journal, API access and RBAC (SelfSubjectAccessReview),
the CRDs, logind and its InhibitDelayMaxSec, NVML and the clock. Prints one
line per check; exits 1 when any check fails.`,
		Args:        noArgs,
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return failed(runDoctor(cmd.Context(), e))
		},
	}
}

// runDoctor is `lifecycle-agent doctor`.
func runDoctor(ctx context.Context, e *env) error {
	return notImplemented(issueDoctor)
}
