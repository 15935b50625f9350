// Command pause is the test node's sandbox (pause) image: it holds the pod's
// namespaces until the runtime stops it (SIGTERM or SIGINT, exit 0), and reaps
// any child re-parented to it. Static (CGO_ENABLED=0); see hack/nodebin.sh.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
