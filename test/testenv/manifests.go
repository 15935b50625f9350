package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/lifecycle-agent/lifecycle-agent/deploy"
)

// Apply server-side-applies every object of a YAML stream as cfg.
func Apply(ctx context.Context, cfg *rest.Config, stream []byte) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("testenv: decode manifests: %w", err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		var m *meta.RESTMapping
		for i := 0; ; i++ {
			m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err == nil || i > 50 {
				break
			}
			mapper.Reset()
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("testenv: no mapping for %s: %w", gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		data, _ := obj.MarshalJSON()
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "testenv", Force: ptr(true)}); err != nil {
			return fmt.Errorf("testenv: apply %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// InstallManifests applies deploy/ (the same stream `lifecycle-agent
// manifests` prints) and waits until the CRDs serve and the admission policy
// is enforced.
func (e *Env) InstallManifests(ctx context.Context) error {
	if err := Apply(ctx, e.AdminConfig(), deploy.Manifests()); err != nil {
		return err
	}
	return e.WaitReady(ctx)
}

// WaitReady waits until both CRDs serve lists and the node-scoping policy
// denies a node writing another node's transition (probed with a dry run).
func (e *Env) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	admin, _ := dynamic.NewForConfig(e.AdminConfig())
	gv := schema.GroupVersion{Group: "lifecycle.x-k8s.io", Version: "v1alpha1"}
	for _, r := range []string{"lifecycleevents", "lifecycletransitions"} {
		if err := poll(ctx, func() (bool, error) {
			_, err := admin.Resource(gv.WithResource(r)).List(ctx, metav1.ListOptions{Limit: 1})
			return err == nil, nil
		}); err != nil {
			return fmt.Errorf("testenv: CRD %s not serving: %w", r, err)
		}
	}
	node, _ := dynamic.NewForConfig(e.NodeConfig("node-a"))
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gv.String(), "kind": "LifecycleTransition",
		"metadata": map[string]any{"name": "testenv-policy-probe"},
		"spec":     map[string]any{"start": "A", "end": "B", "nodeName": "testenv-other-node", "driver": "probe.example.com/probe"},
	}}
	var last error
	if err := poll(ctx, func() (bool, error) {
		_, err := node.Resource(gv.WithResource("lifecycletransitions")).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		last = err
		return err != nil && apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), nil
	}); err != nil {
		return fmt.Errorf("testenv: admission policy not enforced (last answer: %v): %w", last, err)
	}
	return nil
}

func poll(ctx context.Context, f func() (bool, error)) error {
	for {
		ok, err := f()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
