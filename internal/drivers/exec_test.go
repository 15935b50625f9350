package drivers

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

func biosDriver() config.ExecDriver {
	return config.ExecDriver{
		Name:   "example.com/bios-update",
		Start:  "BIOSUpdateStarted",
		End:    "BIOSUpdateComplete",
		SLA:    time.Hour,
		Params: []string{"biosVersion", "firmwareURL"},
		Steps: []config.ExecStep{
			{Name: "stage", Command: []string{"/opt/vendor/stage", "--quiet"}, Timeout: 2 * time.Minute},
			{Name: "flash", Command: []string{"/opt/vendor/flash"}, Check: []string{"/opt/vendor/is-flashed"}},
		},
	}
}

func TestNewExec(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(d *config.ExecDriver)
		wantErr string
	}{
		{name: "valid"},
		{name: "no steps", edit: func(d *config.ExecDriver) { d.Steps = nil }, wantErr: "no steps"},
		{name: "relative command", edit: func(d *config.ExecDriver) { d.Steps[0].Command = []string{"stage"} },
			wantErr: "step stage: command"},
		{name: "relative check", edit: func(d *config.ExecDriver) { d.Steps[1].Check = []string{"is-flashed"} },
			wantErr: "step flash: check"},
		{name: "two parameters, one variable", edit: func(d *config.ExecDriver) { d.Params = []string{"biosVersion", "bios_version"} },
			wantErr: `parameters "biosVersion" and "bios_version" would both be passed as LIFECYCLE_PARAM_BIOS_VERSION`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			def := biosDriver()
			if tt.edit != nil {
				tt.edit(&def)
			}
			d, err := NewExec(def)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if d.Name() != "example.com/bios-update" || d.Short() != "bios-update" || d.Start() != "BIOSUpdateStarted" ||
					d.End() != "BIOSUpdateComplete" || d.SLA() != time.Hour {
					t.Errorf("driver = %s %s %s→%s %s", d.Name(), d.Short(), d.Start(), d.End(), d.SLA())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestExecPlanParameters(t *testing.T) {
	tests := []struct {
		name    string
		params  map[string]string
		wantErr string
	}{
		{name: "declared parameters", params: map[string]string{"biosVersion": "2.1"}},
		{name: "no parameters"},
		{name: "undeclared parameter is named", params: map[string]string{"biosVersion": "2.1", "command": "/bin/sh"},
			wantErr: "parameters.command is not declared by exec driver example.com/bios-update (declared: biosVersion, firmwareURL)"},
		{name: "NUL byte", params: map[string]string{"biosVersion": "2.1\x00"}, wantErr: "parameters.biosVersion contains a NUL byte"},
	}
	d, err := NewExec(biosDriver())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			steps, err := d.Plan(tt.params)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrBadParameter) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Plan error = %v, want ErrBadParameter containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := stepNames(steps); !slices.Equal(got, []string{"stage", "flash"}) {
				t.Errorf("steps = %v", got)
			}
		})
	}
}

func TestExecRun(t *testing.T) {
	notFlashed := &exitErr{status: 1}
	tests := []struct {
		name      string
		simulated bool
		run       func(argv, env []string) (string, error)

		failedStep string
		wantErr    string
		calls      []string
		progress   string
	}{
		{
			name: "happy path: check says not done, both commands run",
			run: func(argv, env []string) (string, error) {
				if argv[0] == "/opt/vendor/is-flashed" {
					return "", notFlashed
				}
				return "staged image 2.1\nok: 2.1 ready\n", nil
			},
			calls:    []string{"host.Run /opt/vendor/stage --quiet", "host.Run /opt/vendor/is-flashed", "host.Run /opt/vendor/flash"},
			progress: "step stage: /opt/vendor/stage succeeded: ok: 2.1 ready",
		},
		{
			name:     "check says done: the step is skipped",
			calls:    []string{"host.Run /opt/vendor/stage --quiet", "host.Run /opt/vendor/is-flashed"},
			progress: "step flash: check /opt/vendor/is-flashed exited 0: already done, skipped",
		},
		{
			name: "step fails: the message carries the output",
			run: func(argv, env []string) (string, error) {
				if argv[0] == "/opt/vendor/stage" {
					return "", &exitErr{status: 3, stderr: "image bios-2.1.bin: checksum mismatch"}
				}
				return "", nil
			},
			failedStep: "stage",
			wantErr:    "command /opt/vendor/stage failed: exit code 3; stderr: image bios-2.1.bin: checksum mismatch",
			calls:      []string{"host.Run /opt/vendor/stage --quiet"},
		},
		{
			name: "check cannot run: fail closed, the command does not run",
			run: func(argv, env []string) (string, error) {
				if argv[0] == "/opt/vendor/is-flashed" {
					return "", errors.New("start: fork/exec /opt/vendor/is-flashed: no such file or directory")
				}
				return "", nil
			},
			failedStep: "flash",
			wantErr:    "check /opt/vendor/is-flashed could not tell whether step flash is done: start: fork/exec",
			calls:      []string{"host.Run /opt/vendor/stage --quiet", "host.Run /opt/vendor/is-flashed"},
		},
		{
			name: "check killed by its timeout: fail closed",
			run: func(argv, env []string) (string, error) {
				if argv[0] == "/opt/vendor/is-flashed" {
					return "", &exitErr{status: -1, stderr: "timed out after 10m0s"}
				}
				return "", nil
			},
			failedStep: "flash",
			wantErr:    "could not tell whether step flash is done",
			calls:      []string{"host.Run /opt/vendor/stage --quiet", "host.Run /opt/vendor/is-flashed"},
		},
		{
			name:      "simulated: checks are not consulted, commands are recorded",
			simulated: true,
			calls:     []string{"host.Run /opt/vendor/stage --quiet", "host.Run /opt/vendor/flash"},
		},
	}
	d, err := NewExec(biosDriver())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newFake()
			rt.host.simulated = tt.simulated
			rt.host.run = tt.run
			steps, err := d.Plan(map[string]string{"biosVersion": "2.1"})
			if err != nil {
				t.Fatal(err)
			}
			failed, err := runSteps(t, steps, rt)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("step %s failed: %v", failed, err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
			if failed != tt.failedStep {
				t.Errorf("failed step = %q, want %q", failed, tt.failedStep)
			}
			if got := rt.rec.list(); !slices.Equal(got, tt.calls) {
				t.Errorf("calls =\n  %q\nwant\n  %q", got, tt.calls)
			}
			if tt.progress != "" && !rt.progressed(tt.progress) {
				t.Errorf("no progress message contains %q; got:\n%s", tt.progress, rt.allProgress())
			}
		})
	}
}

// TestExecEnvironment: the API's parameters reach the commands only as
// LIFECYCLE_PARAM_* variables, next to the event's facts; each command
// runs with its step's timeout.
func TestExecEnvironment(t *testing.T) {
	d, err := NewExec(biosDriver())
	if err != nil {
		t.Fatal(err)
	}
	steps, err := d.Plan(map[string]string{"biosVersion": "2.1", "firmwareURL": "https://fw.example.com/2.1.bin; rm -rf /"})
	if err != nil {
		t.Fatal(err)
	}
	rt := newFake()
	if _, err := runSteps(t, steps[:1], rt); err != nil {
		t.Fatal(err)
	}
	got := rt.host.runs[0]
	want := []string{
		"LIFECYCLE_DRIVER=example.com/bios-update",
		"LIFECYCLE_EVENT=ev-1",
		"LIFECYCLE_NODE=node-a",
		"LIFECYCLE_STEP=stage",
		"LIFECYCLE_PARAM_BIOS_VERSION=2.1",
		"LIFECYCLE_PARAM_FIRMWARE_URL=https://fw.example.com/2.1.bin; rm -rf /",
	}
	if !slices.Equal(got.env, want) {
		t.Errorf("env =\n  %q\nwant\n  %q", got.env, want)
	}
	if !slices.Equal(got.argv, []string{"/opt/vendor/stage", "--quiet"}) {
		t.Errorf("argv = %q: parameters must never reach the command line", got.argv)
	}
	if got.timeout != 2*time.Minute {
		t.Errorf("timeout = %s, want the step's 2m", got.timeout)
	}
	// A step without a timeout gets the default.
	if _, err := runSteps(t, steps[1:], rt); err != nil {
		t.Fatal(err)
	}
	if last := rt.host.runs[len(rt.host.runs)-1]; last.timeout != DefaultExecStepTimeout {
		t.Errorf("default timeout = %s", last.timeout)
	}
}

// TestExecDoneOnReplay: a step whose intent was journaled but not its
// completion asks its check.
func TestExecDoneOnReplay(t *testing.T) {
	d, err := NewExec(biosDriver())
	if err != nil {
		t.Fatal(err)
	}
	steps, err := d.Plan(nil)
	if err != nil {
		t.Fatal(err)
	}
	if steps[0].Done != nil {
		t.Error("a step without a check has a Done check; it should be repeated")
	}
	tests := []struct {
		name    string
		run     func(argv, env []string) (string, error)
		want    bool
		wantErr bool
	}{
		{name: "check exits 0: done", want: true},
		{name: "check exits 1: not done", run: func([]string, []string) (string, error) { return "", &exitErr{status: 1} }},
		{name: "check cannot run: error", run: func([]string, []string) (string, error) { return "", errors.New("no such file") }, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newFake()
			rt.host.run = tt.run
			done, err := steps[1].Done(context.Background(), rt, "boot-0")
			if done != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("Done = %t, %v; want %t, error %t", done, err, tt.want, tt.wantErr)
			}
			if got := rt.rec.list(); !slices.Equal(got, []string{"host.Run /opt/vendor/is-flashed"}) {
				t.Errorf("calls = %q", got)
			}
		})
	}
}

func TestUpperSnake(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{name: "camel", in: "biosVersion", want: "BIOS_VERSION"},
		{name: "trailing acronym", in: "firmwareURL", want: "FIRMWARE_URL"},
		{name: "leading acronym", in: "URLPath", want: "URL_PATH"},
		{name: "digits", in: "slot2Index", want: "SLOT2_INDEX"},
		{name: "snake", in: "slot_2", want: "SLOT_2"},
		{name: "one word", in: "force", want: "FORCE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := upperSnake(tt.in); got != tt.want {
				t.Errorf("upperSnake(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}
