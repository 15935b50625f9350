package main

import (
	"fmt"
	"reflect"
	"testing"
)

func TestParseParams(t *testing.T) {
	many := make([]string, maxParams+1)
	for i := range many {
		many[i] = fmt.Sprintf("k%d=v", i)
	}
	tests := []struct {
		name    string
		raw     []string
		want    map[string]string
		wantErr string
	}{
		{name: "none", raw: nil, want: map[string]string{}},
		{name: "values keep commas and =", raw: []string{"gpus=0,1", "expr=a=b", "empty="}, want: map[string]string{"gpus": "0,1", "expr": "a=b", "empty": ""}},
		{name: "no =", raw: []string{"force"}, wantErr: `--param "force": want key=value`},
		{name: "empty key", raw: []string{"=1"}, wantErr: `--param "=1": want key=value`},
		{name: "twice", raw: []string{"a=1", "a=2"}, wantErr: `--param a given twice`},
		{name: "too many", raw: many, wantErr: fmt.Sprintf("%d parameters; at most %d", maxParams+1, maxParams)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseParams(tt.raw)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v, want %s", err, tt.wantErr)
				}
				if ee, ok := err.(*exitError); !ok || ee.code != exitUsage {
					t.Errorf("error %v is not a usage error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
