package drivers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// Keys of the plan gpu-reset's Resolve fixes at claim. The engine journals
// the map and hands it back, instead of the event's parameters, to Plan and
// Runtime.Params on every replay; Plan then reads the selection from it and
// never from a live inventory. An event's own parameters may not use the
// prefix (Resolve refuses them).
const (
	gpuResolvedPrefix = ResolvedPrefix
	// gpuResolvedVersion marks a resolved map ("1").
	gpuResolvedVersion = gpuResolvedPrefix + "v"
	// gpuResolvedGPUs: the selection as UUIDs, comma list, index order.
	gpuResolvedGPUs = gpuResolvedPrefix + "gpus"
	// gpuResolvedGroup: what is reset together (devices.ResetGroup).
	gpuResolvedGroup = gpuResolvedPrefix + "group"
	// gpuResolvedAll: "true" when gpus=all: every GPU seen at claim must be
	// back afterwards (gpuResolvedCount).
	gpuResolvedAll = gpuResolvedPrefix + "all"
	// gpuResolvedCount: GPUs visible to NVML at claim.
	gpuResolvedCount = gpuResolvedPrefix + "gpuCount"
	// gpuResolvedRoute: "nvidia-smi:<path>" or "nvml".
	gpuResolvedRoute = gpuResolvedPrefix + "route"
	// gpuResolvedServices: units (gpu.services) stopped for this reset,
	// comma list, in stop order: only those that held a GPU of the group
	// at claim, plus Fabric Manager where the generation needs it stopped.
	gpuResolvedServices = gpuResolvedPrefix + "services"
	// gpuResolvedLabels: the GPU Operator deploy labels paused for the
	// reset, JSON {key: value at claim}; they are set to the paused value
	// and restored to exactly these values.
	gpuResolvedLabels = gpuResolvedPrefix + "labels"
	// gpuResolvedNVSwitch: "true" on an NVSwitch system; gpuResolvedWhole
	// "true" when the generation resets the whole set (Fabric Manager
	// stopped).
	gpuResolvedNVSwitch = gpuResolvedPrefix + "nvswitch"
	gpuResolvedWhole    = gpuResolvedPrefix + "wholeSet"
)

const routeNVML = "nvml"
const routeSMIPrefix = "nvidia-smi:"

// routeSMIRootPrefix + <driver root>: nvidia-smi run inside the GPU
// Operator's driver root, `chroot <root> nvidia-smi …`, as NVIDIA's
// NVSentinel gpu-reset job does (nvidia_smi_helper). Persistence mode is
// then set through it too: the driver container's nvidia-persistenced
// answers the nvidia-smi of its own root, not the host's NVML.
const routeSMIRootPrefix = "nvidia-smi-in:"

// DriverRootSMI is where gpu.nvidiaSMI auto looks for nvidia-smi under a
// driver root (the driver container installs it there).
const DriverRootSMI = "usr/bin/nvidia-smi"

// smiInRoot reports whether root holds an executable nvidia-smi.
func smiInRoot(root string) bool {
	fi, err := os.Stat(filepath.Join(root, DriverRootSMI))
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// isFabricManager reports whether a unit is NVIDIA Fabric Manager.
func isFabricManager(unit string) bool { return strings.Contains(unit, "fabricmanager") }

// fabricManagerComm is Fabric Manager's process name as /proc/<pid>/comm
// shows it: nv-fabricmanager cut to the kernel's 15 characters. On a GPU
// Operator node Fabric Manager runs in the driver pod, in no systemd unit,
// so it is recognised by its process as well as by its unit.
const fabricManagerComm = "nv-fabricmanage"

// isFabricManagerHolder reports whether h is Fabric Manager: its unit
// (a host install) or its process (the GPU Operator's driver pod).
func isFabricManagerHolder(h devices.Holder) bool {
	return isFabricManager(h.Unit) || strings.HasPrefix(h.Comm, fabricManagerComm)
}

// Resolve implements Resolver: at claim, against the live host, it turns
// parameters into the plan the event keeps (see the gpuResolved* keys):
// the selection as UUIDs, the reset group, the GPU count, the reset route
// (auto resolved now: an error when nvidia-smi is missing, never a silent
// PCI remove), the services to stop and the GPU Operator labels to pause.
// Bad parameters fail with ErrBadParameter.
func (d GPUReset) Resolve(ctx context.Context, params map[string]string) (map[string]string, error) {
	for k := range params {
		if strings.HasPrefix(k, gpuResolvedPrefix) {
			return nil, fmt.Errorf("%w: parameters.%s: the %q prefix is reserved for the plan fixed at claim", ErrBadParameter, k, gpuResolvedPrefix)
		}
	}
	if b, ok := d.Session.(GPUSessionBlocker); ok {
		if err := b.Blocked(); err != nil {
			return nil, fmt.Errorf("gpu-reset: %w", err)
		}
	}
	p, err := d.parse(params)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(params)+10)
	for k, v := range params {
		out[k] = v
	}
	out[gpuResolvedVersion] = "1"
	out[gpuResolvedGPUs] = strings.Join(p.uuids, ",")
	if strings.TrimSpace(params[GPUResetParamGPUs]) == "all" {
		out[gpuResolvedAll] = "true"
	}
	g, err := d.Devices.ResetGroup(p.uuids)
	if err != nil {
		return nil, fmt.Errorf("gpu-reset: reset group of %s: %w", strings.Join(p.uuids, ", "), err)
	}
	out[gpuResolvedGroup] = strings.Join(g.UUIDs, ",")
	pre, err := d.Devices.Preconditions(g.UUIDs)
	if err != nil {
		return nil, fmt.Errorf("gpu-reset: preconditions of %s: %w", strings.Join(g.UUIDs, ", "), err)
	}
	out[gpuResolvedNVSwitch] = strconv.FormatBool(pre.NVSwitch)
	out[gpuResolvedWhole] = strconv.FormatBool(pre.WholeSet)
	inv, err := d.Devices.List()
	if err != nil {
		return nil, fmt.Errorf("gpu-reset: counting GPUs: %w", err)
	}
	out[gpuResolvedCount] = strconv.Itoa(len(inv))

	route, err := d.route()
	if err != nil {
		return nil, err
	}
	out[gpuResolvedRoute] = route

	services, err := d.servicesFor(g.UUIDs, pre.NVSwitch, pre.WholeSet)
	if err != nil {
		return nil, err
	}
	out[gpuResolvedServices] = strings.Join(services, ",")

	labels, err := d.labelsToPause(ctx)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(labels)
	if err != nil {
		return nil, err
	}
	out[gpuResolvedLabels] = string(b)
	// The readiness snapshot: what the event waits to see back.
	if out, err = d.Readiness.resolve(ctx, out, func(msg string, args ...any) { d.log().Warn(msg, args...) }); err != nil {
		return nil, err
	}
	d.log().Info("gpu-reset plan fixed", "gpus", out[gpuResolvedGPUs], "group", out[gpuResolvedGroup], "route", route,
		"services", out[gpuResolvedServices], "labels", out[gpuResolvedLabels])
	return out, nil
}

// route resolves gpu.resetMethod now: "nvidia-smi:<path>",
// "nvidia-smi-in:<driver root>" or "nvml". nvidia-smi is the driver root's
// when DriverRoot holds one and no SMIPath is configured (gpu.nvidiaSMI
// auto), else SMIPath or the one on PATH.
func (d GPUReset) route() (string, error) {
	switch d.Method {
	case devices.ResetMethodNVML:
		return routeNVML, nil
	case devices.ResetMethodSMI, "", devices.ResetMethodAuto:
		if d.SMIPath == "" && d.DriverRoot != "" && smiInRoot(d.DriverRoot) {
			return routeSMIRootPrefix + d.DriverRoot, nil
		}
		if d.Method == devices.ResetMethodSMI {
			return routeSMIPrefix + d.smiPath(), nil
		}
		look := d.LookPath
		if look == nil {
			look = exec.LookPath
		}
		p, err := look(d.smiPath())
		if err != nil {
			where := ""
			if d.DriverRoot != "" {
				where = fmt.Sprintf(" nor at %s", filepath.Join(d.DriverRoot, DriverRootSMI))
			}
			return "", fmt.Errorf("gpu-reset: %w: %s not found (%w)%s; install it, or set gpu.resetMethod=nvml to reset by PCI remove and rediscover",
				devices.ErrNoResetRoute, d.smiPath(), err, where)
		}
		return routeSMIPrefix + p, nil
	}
	return "", fmt.Errorf("gpu-reset: gpu.resetMethod %q: want nvidia-smi, nvml or auto", d.Method)
}

func (d GPUReset) smiPath() string {
	if d.SMIPath != "" {
		return d.SMIPath
	}
	return "nvidia-smi"
}

// findHolders scans for holders of paths (FindHolders, or the test seam).
func (d GPUReset) findHolders(paths []string) (devices.HolderScan, error) {
	if d.FindHolders != nil {
		return d.FindHolders(paths)
	}
	return devices.FindHolders(d.ProcRoot, paths)
}

// holderPaths lists the device nodes of the group.
func (d GPUReset) holderPaths(group []string) ([]string, error) {
	m, err := d.Devices.HolderPaths(d.DevRoot, group)
	if err != nil {
		return nil, fmt.Errorf("gpu-reset: device nodes of %s: %w", strings.Join(group, ", "), err)
	}
	var out []string
	for _, u := range group {
		out = append(out, m[u])
	}
	return out, nil
}

// servicesFor picks, from gpu.services in their order, the units to stop:
// those with a process holding a device node of the group now, and Fabric
// Manager on a system that resets the whole set (pre-Hopper NVSwitch).
// Fabric Manager is never stopped on a Hopper+ NVSwitch system, where a GPU
// is reset with it running.
func (d GPUReset) servicesFor(group []string, nvswitch, whole bool) ([]string, error) {
	if len(d.Services) == 0 {
		return nil, nil
	}
	paths, err := d.holderPaths(group)
	if err != nil {
		return nil, err
	}
	scan, err := d.findHolders(paths)
	if err != nil {
		return nil, fmt.Errorf("gpu-reset: listing holders of %s: %w", strings.Join(paths, ", "), err)
	}
	var out []string
	for _, u := range d.Services {
		fm := isFabricManager(u)
		holds := slices.ContainsFunc(scan.Holders, func(h devices.Holder) bool { return h.Unit == u })
		switch {
		case fm && nvswitch && !whole:
			continue // Hopper+: single-GPU reset with Fabric Manager running
		case fm && nvswitch && whole, holds:
			out = append(out, u)
		}
	}
	return out, nil
}

// labelsToPause reads this Node's GPU Operator deploy labels: every
// configured component whose label is present and not already paused.
func (d GPUReset) labelsToPause(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	if d.Operator == nil || len(d.OperatorComponents) == 0 {
		return out, nil
	}
	have, err := d.Operator.NodeLabels(ctx)
	if err != nil {
		return nil, fmt.Errorf("gpu-reset: reading the Node's GPU Operator labels: %w", err)
	}
	for _, c := range d.OperatorComponents {
		k := d.labelPrefix() + c
		if v, ok := have[k]; ok && v != d.pausedValue() {
			out[k] = v
		}
	}
	return out, nil
}

func (d GPUReset) labelPrefix() string {
	if d.OperatorLabelPrefix == "" {
		return DefaultGPUOperatorLabelPrefix
	}
	return d.OperatorLabelPrefix
}

func (d GPUReset) pausedValue() string {
	if d.OperatorPausedValue == "" {
		return DefaultGPUOperatorPausedValue
	}
	return d.OperatorPausedValue
}

// parseResolved reads a resolved map (no NVML, no API).
func (d GPUReset) parseResolved(m map[string]string) (*gpuResetPlan, error) {
	raw := map[string]string{}
	for k, v := range m {
		if !strings.HasPrefix(k, gpuResolvedPrefix) {
			raw[k] = v
		}
	}
	p := &gpuResetPlan{d: d, resolved: true}
	o, err := DrainOptionsFrom(raw, DrainTiming{d.RetryDelay, d.DrainTimeout}, append([]string{GPUResetParamGPUs, GPUResetParamDrain}, d.Readiness.params()...)...)
	if err != nil {
		return nil, err
	}
	p.o = o
	if v, ok := raw[GPUResetParamDrain]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("%w: parameters.%s: %q is not true or false", ErrBadParameter, GPUResetParamDrain, v)
		}
		p.drain = b
	}
	split := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ",")
	}
	p.uuids = split(m[gpuResolvedGPUs])
	p.group = split(m[gpuResolvedGroup])
	p.services = split(m[gpuResolvedServices])
	p.route = m[gpuResolvedRoute]
	p.all = m[gpuResolvedAll] == "true"
	p.nvswitch = m[gpuResolvedNVSwitch] == "true"
	p.whole = m[gpuResolvedWhole] == "true"
	var errs []error
	if n, err := strconv.Atoi(m[gpuResolvedCount]); err == nil {
		p.count = n
	} else {
		errs = append(errs, fmt.Errorf("%s: %w", gpuResolvedCount, err))
	}
	if err := json.Unmarshal([]byte(m[gpuResolvedLabels]), &p.labels); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", gpuResolvedLabels, err))
	}
	if len(p.uuids) == 0 || len(p.group) == 0 || p.route == "" {
		errs = append(errs, errors.New("selection, group or route missing"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("gpu-reset: the plan journaled at claim is unreadable: %w", err)
	}
	return p, nil
}
