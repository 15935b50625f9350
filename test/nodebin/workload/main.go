// Command workload is the test node's workload image. It appends one line per
// moment of its life to <dir>/<pod>.log on a hostPath — "start", "sigterm"
// when the runtime asks it to stop, "exit" just before it exits — each line
// "<what> <unix nanoseconds> <RFC 3339 time>" and fsynced, so a test outside
// the VM can tell that a container received SIGTERM and was given its grace
// period. After SIGTERM it keeps running for -linger (it is "busy finishing
// its work") and then exits 0. The pod name comes from $POD_NAME (downward
// API), else the host name (a pod's host name is its name).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	dir := flag.String("dir", "/record", "directory (a hostPath) for the record")
	linger := flag.Duration("linger", 3*time.Second, "how long to keep running after SIGTERM")
	flag.Parse()
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	f, err := os.OpenFile(filepath.Join(*dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "workload: %v\n", err)
		os.Exit(1)
	}
	record := func(what string) {
		now := time.Now()
		fmt.Fprintf(f, "%s %d %s\n", what, now.UnixNano(), now.UTC().Format(time.RFC3339Nano))
		f.Sync()
		fmt.Printf("%s %s\n", what, now.UTC().Format(time.RFC3339Nano))
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	record("start")
	<-sig
	record("sigterm")
	time.Sleep(*linger)
	record("exit")
	f.Close()
}
