// Command kubeprobe runs inside the test VM before the agent exists there:
// with the kubelet's kubeconfig it uses the agent's own API client
// (internal/apiclient) through the guest's only way out, QEMU's guestfwd to
// the host's test apiserver (https://kubernetes:6443), and exits 0 when
// every verb worked. test/vm builds it (CGO_ENABLED=0) and copies it in.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "/etc/kubernetes/kubelet.conf", "kubeconfig")
	node := flag.String("node", "vm-node", "node name")
	parallel := flag.Int("parallel", 8, "parallel connections for /readyz")
	flag.Parse()
	if err := run(*kubeconfig, *node, *parallel); err != nil {
		fmt.Fprintln(os.Stderr, "kubeprobe:", err)
		os.Exit(1)
	}
	fmt.Println("kubeprobe: OK")
}

func run(kubeconfig, node string, parallel int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := apiclient.LoadConfig(kubeconfig)
	if err != nil {
		return err
	}
	fmt.Println("server:", cfg.Host)
	c, err := apiclient.New(cfg, node, 0)
	if err != nil {
		return err
	}
	n, err := c.GetNode(ctx)
	if err != nil {
		return err
	}
	fmt.Println("get node:", n.Name)
	if err := c.SetNodeConditions(ctx, time.Now(), apiclient.NodeCondition{Type: "LifecycleTransition", Status: corev1.ConditionFalse, Reason: "ProbeOK", Message: "kubeprobe from the VM"}); err != nil {
		return err
	}
	fmt.Println("node condition: set")
	if ours, err := c.Cordon(ctx, "kubeprobe"); err != nil || !ours {
		return fmt.Errorf("cordon: ours=%v err=%v", ours, err)
	}
	if changed, err := c.Uncordon(ctx, "kubeprobe", false); err != nil || !changed {
		return fmt.Errorf("uncordon: changed=%v err=%v", changed, err)
	}
	fmt.Println("cordon/uncordon: ok")
	w, err := c.WatchEvents(ctx, func(string) {}, false)
	if err != nil {
		return err
	}
	for !w.Synced() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("event watch did not sync: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Println("event watch: synced,", len(w.List()), "events")

	// Parallel connections, each on its own transport: one relay process each.
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, parallel)
	for i := 0; i < parallel; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg.Clone(), DisableKeepAlives: true, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
			resp, err := hc.Get(cfg.Host + "/readyz")
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "ok" {
				errs <- fmt.Errorf("/readyz: %d %q", resp.StatusCode, b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("readyz: %d parallel connections ok\n", parallel)
	return nil
}
