package devices

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestSelectGPUs(t *testing.T) {
	f := newFleet(t, archH100)
	m, _ := newTestManager(t, f)
	u := f.uuid

	tests := []struct {
		name    string
		param   string
		want    []string
		wantErr []string // substrings of the error
	}{
		{name: "all", param: "all", want: f.allUUIDs()},
		{name: "ALL with spaces", param: "  ALL ", want: f.allUUIDs()},
		{name: "indices in index order", param: "5, 1,5", want: []string{u(1), u(5)}},
		{name: "uuids", param: u(7) + "," + u(0), want: []string{u(0), u(7)}},
		{name: "uuid upper case", param: strings.ToUpper(u(2)), want: []string{u(2)}},
		{name: "empty", param: " ", wantErr: []string{`parameter "gpus"`, `value " "`, "empty"}},
		{name: "empty element", param: "1,,2", wantErr: []string{`parameter "gpus"`, `value "1,,2"`, "empty element"}},
		{name: "index out of range", param: "0,8", wantErr: []string{`parameter "gpus"`, `value "8"`, "no GPU with index 8"}},
		{name: "negative index", param: "-1", wantErr: []string{`value "-1"`, "not a GPU UUID"}},
		{name: "garbage", param: "gpu0", wantErr: []string{`value "gpu0"`, "not a GPU UUID"}},
		{name: "unknown uuid", param: "GPU-00000000-0000-0000-0000-000000000000", wantErr: []string{`value "GPU-00000000-0000-0000-0000-000000000000"`, "no such GPU"}},
		{name: "mixed", param: "0," + u(1), wantErr: []string{`parameter "gpus"`, "mixes UUIDs and indices"}},
		{name: "all mixed", param: "all,1", wantErr: []string{`"all" cannot be combined`}},
		{name: "MIG uuid", param: "MIG-3c1e", wantErr: []string{`value "MIG-3c1e"`, "MIG devices"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.SelectGPUs(tc.param)
			if tc.wantErr != nil {
				if !errors.Is(err, ErrInvalidSelection) {
					t.Fatalf("SelectGPUs(%q) error = %v, want ErrInvalidSelection", tc.param, err)
				}
				containsAll(t, "error", err.Error(), tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatalf("SelectGPUs(%q): %v", tc.param, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("SelectGPUs(%q) = %v, want %v", tc.param, got, tc.want)
			}
		})
	}
}
