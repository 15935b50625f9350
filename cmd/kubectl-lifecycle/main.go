package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/utils/clock"
)

// Set at build time:
//
//	go build -tags kustomize_disable_go_plugin_support \
//	  -ldflags "-X main.version=1.2.3" -o kubectl-lifecycle ./cmd/kubectl-lifecycle
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr, clock.RealClock{})
	stop()
	os.Exit(code)
}
