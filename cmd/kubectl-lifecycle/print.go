package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// outputFlags is -o: the plugin's own table (default) or wide table, or
// any of cli-runtime's printers (json, yaml, name, jsonpath=…,
// go-template=…), as kubectl get has them.
type outputFlags struct {
	pf *genericclioptions.PrintFlags
}

func addOutputFlags(cmd *cobra.Command) *outputFlags {
	pf := genericclioptions.NewPrintFlags("").WithTypeSetter(apiclient.Scheme)
	pf.AddFlags(cmd)
	if f := cmd.Flags().Lookup("output"); f != nil {
		f.Usage = "Output format: wide, json, yaml, name, jsonpath=..., go-template=... (default: a table)"
	}
	return &outputFlags{pf: pf}
}

func (f *outputFlags) format() string { return *f.pf.OutputFormat }
func (f *outputFlags) wide() bool     { return f.format() == "wide" }
func (f *outputFlags) table() bool    { return f.format() == "" || f.wide() }

// printer checks -o before any API call is made.
func (f *outputFlags) printer() (printers.ResourcePrinter, error) {
	if f.table() {
		return nil, nil
	}
	p, err := f.pf.ToPrinter()
	if err != nil {
		return nil, usageErr("-o %s: want wide, json, yaml, name, jsonpath=TEMPLATE or go-template=TEMPLATE", f.format())
	}
	if f.format() == "name" {
		return itemsPrinter{p}, nil
	}
	return p, nil
}

// itemsPrinter prints a list item by item, as kubectl get -o name does:
// cli-runtime's name printer refuses a typed list ("list types are not
// supported by name printing").
type itemsPrinter struct{ printers.ResourcePrinter }

func (p itemsPrinter) PrintObj(obj runtime.Object, w io.Writer) error {
	if !meta.IsListType(obj) {
		return p.ResourcePrinter.PrintObj(obj, w)
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return err
	}
	for _, it := range items {
		if err := p.ResourcePrinter.PrintObj(it, w); err != nil {
			return err
		}
	}
	return nil
}

// typed sets apiVersion and kind on list items, which typed clients leave
// empty, so that json, yaml and name output name them.
func typedEvents(items []v1alpha1.LifecycleEvent) runtime.Object {
	for i := range items {
		items[i].APIVersion, items[i].Kind = v1alpha1.SchemeGroupVersion.String(), "LifecycleEvent"
	}
	return &v1alpha1.LifecycleEventList{Items: items}
}

func typedTransitions(items []v1alpha1.LifecycleTransition) runtime.Object {
	for i := range items {
		items[i].APIVersion, items[i].Kind = v1alpha1.SchemeGroupVersion.String(), "LifecycleTransition"
	}
	return &v1alpha1.LifecycleTransitionList{Items: items}
}

// table writes tab-separated rows aligned as kubectl does.
type table struct{ w io.Writer }

func newTable(out io.Writer, header ...string) *table {
	t := &table{w: printers.GetNewTabWriter(out)}
	t.row(header...)
	return t
}

func (t *table) row(cols ...string) {
	for i, c := range cols {
		if c == "" {
			cols[i] = "<none>"
		}
		cols[i] = strings.ReplaceAll(cols[i], "\t", " ")
	}
	fmt.Fprintln(t.w, strings.Join(cols, "\t"))
}

func (t *table) flush() {
	if f, ok := t.w.(interface{ Flush() error }); ok {
		_ = f.Flush()
	}
}

// age is kubectl's AGE column.
func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

// compact prints a duration without zero units: 1h, 10m, 1h30m, 45s.
func compact(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// took prints an elapsed time for progress lines: 42ms, 1.3s, 2m5s.
func took(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return compact(d)
}

// apiDuration prints the difference of two API times, which have 1 s
// resolution: <1s, 5s, 2m5s.
func apiDuration(d time.Duration) string {
	if d < time.Second {
		return "<1s"
	}
	return compact(d)
}

func timestamp(t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// phase is the STATUS column: the claim status, Pending when unset, and
// Cancelling for an unfinished event being deleted.
func phase(ev *v1alpha1.LifecycleEvent) string {
	cs := ev.Status.ClaimStatus
	if cs == "" {
		cs = v1alpha1.LifecycleEventPending
	}
	if ev.DeletionTimestamp != nil && !cs.Finished() {
		return "Cancelling"
	}
	return string(cs)
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if max > 3 && len(s) > max {
		s = s[:max-3] + "..."
	}
	return s
}
