package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

type unpublishOptions struct {
	Force   bool
	Timeout time.Duration
}

func newUnpublishCmd(e *env) *cobra.Command {
	var o unpublishOptions
	cmd := &cobra.Command{
		Use:   "unpublish [--force]",
		Short: "Withdraw the LifecycleTransitions this node's agent published (the package's prerm runs it on removal)",
		Long: `Delete the LifecycleTransitions the agent published for this node (label
app.kubernetes.io/managed-by=lifecycle-agent, spec.nodeName = this node), so
that nobody asks a node without an agent for a transition. The running agent
withdraws the transitions of drivers that are disabled by itself when it
starts; this command is for an agent that stops for good: apt remove runs it.

Stop the agent first (it holds the journal). A transition that an unfinished
event in the journal uses is kept, and the command fails, unless --force.`,
		Example:     "  systemctl stop lifecycle-agent && lifecycle-agent unpublish",
		Args:        noArgs,
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return failed(runUnpublish(cmd.Context(), e, o))
		},
	}
	cmd.Flags().BoolVar(&o.Force, "force", false, "withdraw transitions that unfinished events in the journal use, too")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 20*time.Second, "give up on the API server after this long")
	return cmd
}

// journaledTransitions returns the transitions the journal's unfinished
// events use (event name by transition). A missing journal holds none.
func journaledTransitions(path string) (map[string]string, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var buf bytes.Buffer
	if err := journal.Export(path, &buf); err != nil {
		if errors.Is(err, journal.ErrLocked) {
			return nil, fmt.Errorf("the journal %s is in use: stop the agent first (systemctl stop lifecycle-agent): %w", path, err)
		}
		return nil, err
	}
	var doc journal.ExportDoc
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		return nil, fmt.Errorf("read the journal %s: %w", path, err)
	}
	used := map[string]string{}
	for _, ev := range doc.Events {
		if tn := ev.Attrs["transition"]; tn != "" {
			used[tn] = ev.Name
		}
	}
	return used, nil
}

func runUnpublish(ctx context.Context, e *env, o unpublishOptions) error {
	cfg := e.cfg
	used, err := journaledTransitions(cfg.JournalPath)
	if err != nil {
		return err
	}
	rc, err := apiclient.LoadConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	api, err := apiclient.New(rc, cfg.NodeName, o.Timeout)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	keep := map[string]bool{}
	if !o.Force {
		for tn := range used {
			keep[tn] = true
		}
	}
	deleted, kept, err := api.WithdrawTransitions(ctx, keep)
	for _, n := range deleted {
		fmt.Fprintf(e.stdout, "withdrew lifecycletransition %s\n", n)
	}
	if err != nil {
		return err
	}
	if len(kept) > 0 {
		var why []string
		for _, n := range kept {
			why = append(why, fmt.Sprintf("%s (used by unfinished event %s)", n, used[n]))
		}
		return fmt.Errorf("kept %s: finish or delete the event, or use --force", strings.Join(why, ", "))
	}
	if len(deleted) == 0 {
		fmt.Fprintf(e.stdout, "no lifecycletransitions published for node %s\n", cfg.NodeName)
	}
	return nil
}
