package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/lifecycle-agent/lifecycle-agent/deploy"
)

func newManifestsCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:     "manifests",
		Short:   "Print the cluster manifests (CRDs, RBAC, admission policy)",
		Example: "  lifecycle-agent manifests | kubectl apply -f -",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return failed(runManifests(cmd.Context(), e))
		},
	}
}

func runManifests(_ context.Context, e *env) error {
	if _, err := e.stdout.Write(deploy.Manifests()); err != nil {
		return fmt.Errorf("write manifests: %w", err)
	}
	return nil
}
