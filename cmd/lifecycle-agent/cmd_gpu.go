package main

// `lifecycle-agent gpu inventory|reset|xids`: read-only views of this
// node's NVIDIA GPUs through the same devices.Manager the agent uses.
//
//	gpu inventory [-o text|json]            identity, modes, processes, health per GPU
//	gpu reset --dry-run --gpus SEL [--drain]  the gpu-reset checks, up to (not
//	                                        including) the reset, and what it would do
//	gpu xids [--kernel-log PATH] [-o text|json]  the kernel log's XIDs, judged
//	                                        as the GPU monitor does (no NVML needed)
//
// Exit codes: 0 ok; 1 failed (for reset --dry-run: the reset would be
// refused now, the blockers are printed); 2 usage (gpu reset without
// --dry-run: a real reset only happens through a LifecycleEvent); 3 no NVML
// on this host (no libnvidia-ml.so.1 or no loaded driver).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	daemon "github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// exitNoNVML: the host has no usable NVML.
const exitNoNVML = 3

func newGPUCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gpu inventory|reset|xids",
		Short: "Inspect this node's NVIDIA GPUs (read-only)",
		Long: `Read this node's NVIDIA GPUs through NVML, as the agent does. Nothing here changes
a GPU: a real reset only happens through a gpu-reset LifecycleEvent.
Exit codes: 0 ok, 1 failed (reset --dry-run: the reset would be refused), 2 usage, 3 no NVML on this host.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageErrorf("missing subcommand: inventory, reset or xids")
		},
	}
	cmd.AddCommand(newGPUInventoryCmd(e), newGPUResetCmd(e), newGPUXIDsCmd(e))
	return cmd
}

type gpuInventoryOptions struct {
	Output string // outText or outJSON
}

func newGPUInventoryCmd(e *env) *cobra.Command {
	var o gpuInventoryOptions
	cmd := &cobra.Command{
		Use:   "inventory",
		Short: "List the GPUs with their modes, processes and health",
		Long: `Print every GPU NVML sees: index, UUID, name, PCI bus ID, architecture, MIG and
persistence modes, running processes, the health signals and the verdict that
the GPUHealthy condition is built from. Exits 3 on a host without NVML (or
without the library under gpu.driverRoot).`,
		// The config: gpu.driverRoot says where NVML is.
		Annotations: needsConfig,
		Args:        noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Output, err = outputOf(cmd, o.Output, outText, outJSON); err != nil {
				return err
			}
			return failed(runGPUInventory(cmd.Context(), e, o))
		},
	}
	addOutputFlags(cmd, &o.Output, outText, outJSON)
	return cmd
}

type gpuResetOptions struct {
	DryRun bool
	GPUs   string
	Drain  bool

	// operatorErr: the API client for the deploy labels could not be built.
	operatorErr error
}

func newGPUResetCmd(e *env) *cobra.Command {
	var o gpuResetOptions
	cmd := &cobra.Command{
		Use:   "reset --dry-run --gpus all|UUIDs|indices [--drain]",
		Short: "Show what a gpu-reset event would do (dry run only)",
		Long: `Run the gpu-reset driver's checks for --gpus (and --drain) up to, but not
including, the reset: the selection, the reset group, the preconditions
(processes, MIG, persistence mode), the fabric state, the services it would
stop and what the reset would run. Nothing is changed. --dry-run is required:
a real reset only happens through a LifecycleEvent
(lifecycle-agent request gpu-reset --param gpus=...). Exits 1 when the reset
would be refused now.`,
		Args:        noArgs,
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !o.DryRun {
				return usageErrorf("refusing to reset without --dry-run: a real GPU reset only runs through a gpu-reset LifecycleEvent (lifecycle-agent request gpu-reset --param gpus=...)")
			}
			if strings.TrimSpace(o.GPUs) == "" {
				return usageErrorf("missing --gpus: all, GPU UUIDs or indices")
			}
			return failed(runGPUResetDryRun(cmd.Context(), e, o))
		},
	}
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "check and print what would be done; required")
	cmd.Flags().StringVar(&o.GPUs, "gpus", "", `the gpus parameter: "all", a comma list of GPU UUIDs, or a comma list of indices`)
	cmd.Flags().BoolVar(&o.Drain, "drain", false, "plan as with parameters.drain=true")
	return cmd
}

// openGPUs loads NVML (from gpu.driverRoot when set); no NVML exits 3. The
// caller shuts the Manager down.
func openGPUs(cfg *config.Config, log *slog.Logger) (*devices.Manager, error) {
	lib, err := daemon.NVMLLibrary(cfg)
	if err != nil {
		return nil, &exitError{code: exitNoNVML, err: err}
	}
	m, err := devices.New(devices.Config{Logger: log, LibraryPath: lib})
	if err != nil {
		return nil, err
	}
	if err := m.Init(); err != nil {
		if errors.Is(err, devices.ErrNoNVML) {
			return nil, &exitError{code: exitNoNVML, err: fmt.Errorf("no NVML on this host: %w", err)}
		}
		return nil, err
	}
	return m, nil
}

// gpuLog is quiet (warnings only) unless the configuration asks for debug.
func gpuLog(e *env) *slog.Logger {
	if e.cfg != nil && e.cfg.SlogLevel() < slog.LevelInfo {
		return e.log
	}
	format := config.LogFormatText
	if e.cfg != nil {
		format = e.cfg.LogFormat
	}
	return newLogger(e.stderr, slog.LevelWarn, format)
}

// gpuJSON is one GPU of `gpu inventory -o json`.
type gpuJSON struct {
	Index               int               `json:"index"`
	UUID                string            `json:"uuid"`
	Name                string            `json:"name,omitempty"`
	PCIBusID            string            `json:"pciBusID,omitempty"`
	Architecture        string            `json:"architecture"`
	MIG                 string            `json:"mig"`
	MIGPending          string            `json:"migPending"`
	Persistence         string            `json:"persistence"`
	ProcessesKnown      bool              `json:"processesKnown"`
	ComputePIDs         []uint32          `json:"computePIDs,omitempty"`
	GraphicsPIDs        []uint32          `json:"graphicsPIDs,omitempty"`
	RetiredPagesPending string            `json:"retiredPagesPending"`
	RemappedRows        *remappedRowsJSON `json:"remappedRows,omitempty"`
	ECC                 *eccJSON          `json:"eccVolatile,omitempty"`
	RecoveryAction      string            `json:"recoveryAction"`
	Fabric              *fabricJSON       `json:"fabric,omitempty"`
	NVLinksActive       int               `json:"nvlinksActive"`
	NVSwitchLinks       int               `json:"nvswitchLinks"`
	CriticalXIDs        []uint64          `json:"criticalXIDs,omitempty"`
	Lost                bool              `json:"lost,omitempty"`
	ResetRequired       bool              `json:"resetRequired,omitempty"`
	ReadErrors          []string          `json:"readErrors,omitempty"`
	Healthy             bool              `json:"healthy"`
	Reasons             []string          `json:"reasons,omitempty"`
	NotSupported        []string          `json:"notSupported,omitempty"`
}

type remappedRowsJSON struct {
	Correctable   int  `json:"correctable"`
	Uncorrectable int  `json:"uncorrectable"`
	Pending       bool `json:"pending"`
	Failure       bool `json:"failure"`
}

type eccJSON struct {
	Uncorrected uint64 `json:"uncorrected"`
	Corrected   uint64 `json:"corrected"`
}

type fabricJSON struct {
	State  string `json:"state"`
	Status string `json:"status,omitempty"`
}

type conditionJSON struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type inventoryJSON struct {
	DriverVersion string        `json:"driverVersion"`
	NVSwitch      bool          `json:"nvswitch"`
	Condition     conditionJSON `json:"condition"`
	GPUs          []gpuJSON     `json:"gpus"`
}

func inventoryView(s devices.Snapshot) inventoryJSON {
	rep := devices.Evaluate(s)
	c := rep.Condition
	out := inventoryJSON{DriverVersion: s.DriverVersion, NVSwitch: s.NVSwitch,
		Condition: conditionJSON{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}, GPUs: []gpuJSON{}}
	for i, g := range s.GPUs {
		h := rep.GPUs[i]
		j := gpuJSON{
			Index: g.Index, UUID: g.UUID, Name: g.Name, PCIBusID: g.PCIBusID, Architecture: g.Architecture,
			MIG: g.MIGCurrent.String(), MIGPending: g.MIGPending.String(), Persistence: g.Persistence.String(),
			ProcessesKnown: g.ProcessesKnown, ComputePIDs: g.ComputePIDs, GraphicsPIDs: g.GraphicsPIDs,
			RetiredPagesPending: g.RetiredPagesPending.String(), RecoveryAction: g.RecoveryAction.String(),
			NVLinksActive: g.NVLinksActive, NVSwitchLinks: g.NVSwitchLinks, CriticalXIDs: g.CriticalXIDs,
			Lost: g.Lost, ResetRequired: g.ResetRequired, ReadErrors: g.ReadErrors,
			Healthy: h.Healthy, Reasons: h.Reasons, NotSupported: h.Unknown,
		}
		if r := g.RemappedRows; r.Known {
			j.RemappedRows = &remappedRowsJSON{Correctable: r.Correctable, Uncorrectable: r.Uncorrectable, Pending: r.Pending, Failure: r.Failure}
		}
		if g.ECC.Known {
			j.ECC = &eccJSON{Uncorrected: g.ECC.VolatileUncorrected, Corrected: g.ECC.VolatileCorrected}
		}
		if g.Fabric.Known {
			j.Fabric = &fabricJSON{State: g.Fabric.State.String(), Status: g.Fabric.Status}
		}
		out.GPUs = append(out.GPUs, j)
	}
	return out
}

// runGPUInventory is `lifecycle-agent gpu inventory`.
func runGPUInventory(_ context.Context, e *env, o gpuInventoryOptions) (err error) {
	m, err := openGPUs(e.cfg, gpuLog(e))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Shutdown()) }()
	return writeInventory(e.stdout, m, o)
}

// writeInventory prints m's GPUs as a table or as JSON.
func writeInventory(out io.Writer, m *devices.Manager, o gpuInventoryOptions) error {
	s, err := m.Snapshot()
	if err != nil {
		return err
	}
	v := inventoryView(s)
	if o.Output == outJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	fmt.Fprintf(out, "driver %s, %d GPU(s), NVSwitch: %v\n", v.DriverVersion, len(v.GPUs), v.NVSwitch)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "INDEX\tUUID\tNAME\tPCI\tARCH\tMIG\tPERSISTENCE\tPROCESSES\tFABRIC\tHEALTH")
	for _, g := range v.GPUs {
		procs := fmt.Sprint(len(g.ComputePIDs) + len(g.GraphicsPIDs))
		if !g.ProcessesKnown {
			procs = "unknown"
		}
		fabric := "-"
		if g.Fabric != nil {
			fabric = g.Fabric.State
		}
		health := "healthy"
		if !g.Healthy {
			health = strings.Join(g.Reasons, ", ")
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.UUID, g.Name, g.PCIBusID, g.Architecture,
			g.MIG, g.Persistence, procs, fabric, health)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s: %s (%s): %s\n", v.Condition.Type, v.Condition.Status, v.Condition.Reason, v.Condition.Message)
	return err
}

// runGPUResetDryRun is `lifecycle-agent gpu reset --dry-run`.
func runGPUResetDryRun(ctx context.Context, e *env, o gpuResetOptions) (err error) {
	method, err := devices.ParseResetMethod(e.cfg.GPU.ResetMethod)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	m, err := openGPUs(e.cfg, gpuLog(e))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Shutdown()) }()
	smiPath, driverRoot := daemon.GPUResetSMI(e.cfg)
	op := e.cfg.GPU.Operator
	d := drivers.GPUReset{Devices: m, Method: method, Services: e.cfg.GPU.Services, Log: gpuLog(e), SMIPath: smiPath, DriverRoot: driverRoot,
		OperatorComponents: op.Components, OperatorLabelPrefix: op.LabelPrefix, OperatorPausedValue: op.PausedValue}
	if len(op.Components) > 0 {
		// The deploy labels are the Node's: read them as the agent would
		// (its kubeconfig). Unreachable, the plan says so and goes on.
		if rc, err := apiclient.LoadConfig(e.cfg.Kubeconfig); err != nil {
			o.operatorErr = err
		} else if api, err := apiclient.New(rc, e.cfg.NodeName, e.cfg.APITimeout); err != nil {
			o.operatorErr = err
		} else {
			d.Operator = api
		}
	}
	return writeResetDryRun(ctx, e.stdout, d, o)
}

// writeResetDryRun runs the gpu-reset checks (drivers.GPUReset.Check:
// nothing changes) and prints what a reset would do. It returns an error
// when the reset would be refused now.
func writeResetDryRun(ctx context.Context, out io.Writer, d drivers.GPUReset, o gpuResetOptions) error {
	params := map[string]string{drivers.GPUResetParamGPUs: o.GPUs}
	if o.Drain {
		params[drivers.GPUResetParamDrain] = "true"
	}
	c, err := d.Check(params)
	if errors.Is(err, drivers.ErrBadParameter) {
		return &exitError{code: exitUsage, err: err, hint: true}
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "dry run: nothing was changed")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "selected:\t%s\n", strings.Join(c.Requested, ", "))
	group := fmt.Sprintf("%d GPU(s): %s", len(c.Group.UUIDs), strings.Join(c.Group.UUIDs, ", "))
	if c.Group.Expanded {
		group += " (expanded: " + c.Group.Reason + ")"
	}
	fmt.Fprintf(w, "reset group:\t%s\n", group)
	fmt.Fprintf(w, "nvswitch:\t%v\n", c.Preconditions.NVSwitch)
	var fabric []string
	for _, u := range c.Group.UUIDs {
		f, ok := c.Fabric[u]
		switch {
		case !ok || !f.Known:
			fabric = append(fabric, u+" not reported")
		case f.Status != "":
			fabric = append(fabric, fmt.Sprintf("%s %s (%s)", u, f.State, f.Status))
		default:
			fabric = append(fabric, u+" "+f.State.String())
		}
	}
	fmt.Fprintf(w, "fabric:\t%s\n", strings.Join(fabric, ", "))
	if len(c.PersistenceOn) > 0 {
		fmt.Fprintf(w, "persistence:\twould turn off on %s and restore it after the reset\n", strings.Join(c.PersistenceOn, ", "))
	} else {
		fmt.Fprintf(w, "persistence:\toff on every GPU of the group\n")
	}
	if len(c.Services) > 0 {
		fmt.Fprintf(w, "would stop:\t%s (started again in reverse order)\n", strings.Join(c.Services, ", "))
	} else {
		fmt.Fprintf(w, "would stop:\tnothing (gpu.services is empty)\n")
	}
	if c.Drain {
		fmt.Fprintf(w, "drain:\twould cordon and drain the node first, and uncordon it at the end\n")
	}
	fmt.Fprintf(w, "gpu operator:\t%s\n", operatorPlan(ctx, d, o.operatorErr))
	if len(c.Holders) == 0 {
		fmt.Fprintf(w, "holders now:\tnone\n")
	}
	for _, h := range c.Holders {
		note := ""
		if h.Comm == "lifecycle-agent" {
			note = " (the agent: it lets go of its NVML session for the reset)"
		}
		fmt.Fprintf(w, "holder now:\t%s%s\n", h, note)
	}
	fmt.Fprintf(w, "inhibitor:\t%s (block) held during the reset\n", drivers.GPUInhibit)
	fmt.Fprintf(w, "reset:\t%s\n", c.Resetter)
	fmt.Fprintf(w, "steps:\t%s\n", strings.Join(c.Steps, ", "))
	if len(c.Blockers) == 0 {
		fmt.Fprintf(w, "blockers:\tnone\n")
	}
	for _, b := range c.Blockers {
		fmt.Fprintf(w, "blocker:\t%s\n", b)
	}
	for _, x := range c.Warnings {
		fmt.Fprintf(w, "warning:\t%s\n", x)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(c.Blockers) > 0 && !(c.Drain && onlyProcesses(c.Blockers)) {
		return fmt.Errorf("the reset would be refused now: %d blocker(s)", len(c.Blockers))
	}
	return nil
}

// operatorPlan says what the reset would do to the GPU Operator's deploy
// labels on this Node, read now.
func operatorPlan(ctx context.Context, d drivers.GPUReset, apiErr error) string {
	switch {
	case len(d.OperatorComponents) == 0:
		return "nothing to pause (gpu.operator.components is empty)"
	case apiErr != nil:
		return "deploy labels not read (" + apiErr.Error() + "): the claim reads them"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	labels, err := d.OperatorLabels(ctx)
	if err != nil {
		return "deploy labels not read (" + err.Error() + "): the claim reads them"
	}
	if len(labels) == 0 {
		return "no deploy label of gpu.operator.components on this Node: nothing to pause"
	}
	var set []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		set = append(set, fmt.Sprintf("%s=%s (now %s)", k, d.PausedValue(), labels[k]))
	}
	return "would set " + strings.Join(set, ", ") + ", wait for those pods to go, and restore the values after the reset"
}

// onlyProcesses: with --drain, running processes are expected to end.
func onlyProcesses(blockers []string) bool {
	for _, b := range blockers {
		if !strings.Contains(b, ": processes running (") {
			return false
		}
	}
	return true
}
