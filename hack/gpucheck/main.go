// Command gpucheck is hack/gpu-check.sh's helper on a machine with a real
// NVIDIA GPU. Every subcommand only reads:
//
//	gpucheck compare INVENTORY.json SMI.xml   the agent's `gpu inventory --json`
//	                                          against `nvidia-smi -q -x`, field by field
//	gpucheck time [-sweeps N] [-driver-root DIR]
//	                                          NVML init, N health sweeps, XID event
//	                                          registration and shutdown, timed in-process
//	gpucheck holders                          processes holding /dev/nvidia* open
//
// It is built stripped with the agent by `make gpu-check-bin`, so that a
// GPU machine without Go or network runs prebuilt binaries. Exit status:
// 0 ok, 1 a difference or a failed read, 2 usage, 3 no NVML.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: gpucheck compare INVENTORY.json SMI.xml | time [-sweeps N] [-driver-root DIR] | holders")
		return 2
	}
	switch args[0] {
	case "compare":
		if len(args) != 3 {
			fmt.Fprintln(stderr, "usage: gpucheck compare INVENTORY.json SMI.xml")
			return 2
		}
		inv, err := os.ReadFile(args[1])
		if err != nil {
			fmt.Fprintln(stderr, "gpucheck:", err)
			return 1
		}
		smi, err := os.ReadFile(args[2])
		if err != nil {
			fmt.Fprintln(stderr, "gpucheck:", err)
			return 1
		}
		diffs, err := Compare(inv, smi, stdout)
		if err != nil {
			fmt.Fprintln(stderr, "gpucheck:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%d difference(s)\n", diffs)
		if diffs > 0 {
			return 1
		}
		return 0
	case "time":
		fs := flag.NewFlagSet("time", flag.ContinueOnError)
		fs.SetOutput(stderr)
		sweeps := fs.Int("sweeps", 5, "health sweeps to time")
		root := fs.String("driver-root", "", "gpu.driverRoot: load NVML from under this directory")
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() != 0 || *sweeps < 1 {
			return 2
		}
		return timeNVML(*root, *sweeps, stdout, stderr)
	case "holders":
		paths, _ := filepath.Glob("/dev/nvidia*")
		scan, err := devices.FindHolders("", paths)
		if err != nil {
			fmt.Fprintln(stderr, "gpucheck:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%d device node(s), %d holder(s)\n", len(paths), len(scan.Holders))
		for _, h := range scan.Holders {
			fmt.Fprintln(stdout, " ", h.String())
		}
		return 0
	}
	fmt.Fprintf(stderr, "gpucheck: unknown subcommand %q\n", args[0])
	return 2
}

// timeNVML times what the agent does with NVML: init, health sweeps (a
// snapshot judged as the monitor does), registering the XID event set,
// shutdown.
func timeNVML(root string, sweeps int, stdout, stderr io.Writer) int {
	lib := ""
	if root != "" {
		var err error
		if lib, err = devices.DriverRootLibrary(root); err != nil {
			fmt.Fprintln(stderr, "gpucheck:", err)
			return 3
		}
	}
	m, err := devices.New(devices.Config{LibraryPath: lib})
	if err != nil {
		fmt.Fprintln(stderr, "gpucheck:", err)
		return 1
	}
	t := time.Now()
	if err := m.Init(); err != nil {
		fmt.Fprintln(stderr, "gpucheck: NVML init:", err)
		return 3
	}
	fmt.Fprintf(stdout, "nvml init: %s\n", time.Since(t).Round(time.Microsecond))
	code := 0
	for i := 1; i <= sweeps; i++ {
		t = time.Now()
		s, err := m.Snapshot()
		if err != nil {
			fmt.Fprintf(stdout, "health sweep %d: %s, error: %v\n", i, time.Since(t).Round(time.Microsecond), err)
			code = 1
			continue
		}
		r := devices.Evaluate(s)
		fmt.Fprintf(stdout, "health sweep %d: %s, %d GPU(s), %s/%s\n", i, time.Since(t).Round(time.Microsecond), len(s.GPUs), r.Condition.Status, r.Condition.Reason)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t = time.Now()
	ch, err := m.WatchEvents(ctx, nil)
	fmt.Fprintf(stdout, "xid event registration: %s, err: %v\n", time.Since(t).Round(time.Microsecond), err)
	cancel()
	if ch != nil {
		for range ch { // the watcher frees its event set, then closes
		}
	}
	t = time.Now()
	err = m.Shutdown()
	fmt.Fprintf(stdout, "nvml shutdown: %s, err: %v\n", time.Since(t).Round(time.Microsecond), err)
	if err != nil {
		code = 1
	}
	return code
}
