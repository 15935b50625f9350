package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Set at build time:
//
//	go build -tags kustomize_disable_go_plugin_support \
//	  -ldflags "-X main.version=1.2.3 -X main.commit=$(git rev-parse --short HEAD)" ./cmd/lifecycle-agent
var (
	version = "dev"
	commit  = ""
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
