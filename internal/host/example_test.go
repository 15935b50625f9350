package host_test

import (
	"context"
	"fmt"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
)

// The logind lock discipline of STYLE rule 10, against the fake logind.
func Example_lockDiscipline() {
	srv, err := logindtest.New("", logindtest.Options{InhibitDelayMax: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := host.New(host.Config{Address: srv.Address()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()

	// At start: check the delay logind grants, take the delay lock and
	// keep the *InhibitLock referenced.
	budget := 20 * time.Second
	if d, err := l.InhibitDelayMax(ctx); err != nil || d < budget {
		fmt.Println("warning: InhibitDelayMax below the shutdown budget:", d, err)
	}
	lock, err := l.Inhibit(ctx, "shutdown", "lifecycle-agent", "record the shutdown step", host.ModeDelay)
	if err != nil {
		fmt.Println(err)
		return
	}
	events, err := l.WatchPrepareForShutdown(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}

	// A shutdown begins: journal the step, commit, and only then release.
	_ = srv.EmitPrepareForShutdown(true)
	fmt.Println("PrepareForShutdown:", <-events)
	// ... journal commit here ...
	_ = lock.Release()
	_ = srv.WaitReleased(ctx, 0)

	// The shutdown is cancelled: take the delay lock again.
	_ = srv.EmitPrepareForShutdown(false)
	fmt.Println("PrepareForShutdown:", <-events)
	lock, err = l.Inhibit(ctx, "shutdown", "lifecycle-agent", "record the shutdown step", host.ModeDelay)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lock.Release()

	held, err := l.ListInhibitors(ctx)
	if err != nil || len(held) != 1 {
		fmt.Println("ListInhibitors:", held, err)
		return
	}
	fmt.Println("locks held:", len(held), held[0].Mode, held[0].What)
	// Output:
	// PrepareForShutdown: true
	// PrepareForShutdown: false
	// locks held: 1 delay shutdown
}
