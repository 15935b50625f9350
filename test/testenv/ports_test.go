package testenv

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortDistinct: ports handed out one after the other in a process
// differ even before anything binds them (test/plugin's agents are given
// their metrics ports first and bind them a moment later; two picks of :0
// once returned the same port: "bind: address already in use"), lie below
// the ephemeral range, and are free.
func TestFreePortDistinct(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < 20000 || p >= 32768 {
			t.Fatalf("port %d outside 20000-32767", p)
		}
	}
	for p := range seen {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		_ = l.Close()
		break
	}
}
