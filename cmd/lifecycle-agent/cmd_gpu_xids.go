package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

type gpuXIDsOptions struct {
	Output    string // outText or outJSON
	KernelLog string
}

// `gpu xids`: the NVIDIA module's XIDs in this boot's kernel log, judged as
// the GPU monitor judges them (devices.ClassifyXID). It needs no NVML; with
// NVML it names the GPU at each PCI address.
func newGPUXIDsCmd(e *env) *cobra.Command {
	o := gpuXIDsOptions{KernelLog: devices.DefaultKernelLog}
	cmd := &cobra.Command{
		Use:   "xids [--kernel-log PATH]",
		Short: "List the XIDs in this boot's kernel log, as the agent judges them",
		Long: `Read the NVIDIA module's "NVRM: Xid (PCI:…): N" lines from the kernel log (this
boot's, as far back as the ring buffer reaches) and print each with its
class — ignorable, informational, reset, reboot, replace (docs/gpu.md) — and,
when NVML loads, the GPU at that PCI address. Only lines the kernel logged
count, as for the agent. Exits 1 when the kernel log cannot be read (it needs
root, like the agent).`,
		Annotations: needsConfig,
		Args:        noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Output, err = outputOf(cmd, o.Output, outText, outJSON); err != nil {
				return err
			}
			return failed(runGPUXIDs(e, o))
		},
	}
	cmd.Flags().StringVar(&o.KernelLog, "kernel-log", o.KernelLog, "the kernel log to read (a file of /dev/kmsg's record format works too)")
	addOutputFlags(cmd, &o.Output, outText, outJSON)
	return cmd
}

// xidJSON is one XID of `gpu xids -o json`.
type xidJSON struct {
	Seq   uint64 `json:"seq"`
	PCI   string `json:"pci"`
	Index *int   `json:"index,omitempty"`
	UUID  string `json:"uuid,omitempty"`
	XID   uint64 `json:"xid"`
	Class string `json:"class"`
	Text  string `json:"text"`
}

func runGPUXIDs(e *env, o gpuXIDsOptions) (err error) {
	k, err := devices.OpenKernelLog(o.KernelLog)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, k.Close()) }()
	recs, lost, err := k.Records()
	if err != nil {
		return err
	}
	var xids []devices.KernelXID
	for _, r := range recs {
		if x, ok := devices.KernelXIDOf(r); ok {
			xids = append(xids, x)
		}
	}
	// NVML names the GPUs when it loads; the XIDs are worth listing without.
	var snap devices.Snapshot
	if m, oerr := openGPUs(e.cfg, gpuLog(e)); oerr == nil {
		if s, serr := m.Snapshot(); serr == nil {
			snap = s
		}
		err = errors.Join(err, m.Shutdown())
	}
	if werr := writeXIDs(e.stdout, xids, snap, lost, o); werr != nil {
		return errors.Join(err, werr)
	}
	return err
}

// writeXIDs prints the XIDs, each with its class and, when snap has one at
// its PCI address, the GPU.
func writeXIDs(out io.Writer, xids []devices.KernelXID, snap devices.Snapshot, lost bool, o gpuXIDsOptions) error {
	view := make([]xidJSON, 0, len(xids))
	for _, x := range xids {
		v := xidJSON{Seq: x.Seq, PCI: x.Bus, XID: x.XID, Class: devices.ClassifyXID(x.XID, nil).String(), Text: x.Text}
		if g, ok := snap.AtBus(x.Bus); ok {
			i := g.Index
			v.Index, v.UUID = &i, g.UUID
		}
		view = append(view, v)
	}
	if o.Output == outJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"xids": view, "recordsLost": lost})
	}
	if lost {
		fmt.Fprintln(out, "some kernel log records were overwritten before they could be read")
	}
	if len(view) == 0 {
		_, err := fmt.Fprintln(out, "no XIDs in the kernel log")
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SEQ\tPCI\tGPU\tXID\tCLASS\tMESSAGE")
	for _, v := range view {
		gpu := "-"
		if v.Index != nil {
			gpu = fmt.Sprintf("%d %s", *v.Index, v.UUID)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\n", v.Seq, v.PCI, gpu, v.XID, v.Class, v.Text)
	}
	return w.Flush()
}
