package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync/atomic"
)

// FreePort returns a free TCP port on 127.0.0.1 below Linux's ephemeral
// range (32768-60999): the agent gets it on its command line and binds it
// a moment later, and a port from the ephemeral range (what Listen on :0
// hands out) can be taken in between by any process's outgoing connection
// or :0 listener (seen twice in 392 chaos schedules: "bind: address already
// in use"; and in test/plugin, where two picks of :0 returned the same
// port). The agent refuses port 0 (metricsAddress wants a fixed port).
func FreePort() (int, error) {
	for range 1000 {
		p := int(nextPort.Add(1))%(32768-20000) + 20000
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p, nil
	}
	return 0, errors.New("no free port in 20000-32767")
}

// nextPort walks 20000-32767 from a random start, so that two test
// processes rarely try the same ports.
var nextPort = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(rand.Int64N(32768 - 20000))
	return &n
}()
