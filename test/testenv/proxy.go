package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"syscall"

	"k8s.io/client-go/rest"
)

// CutProxy is a TCP proxy between a client and the test apiserver that a
// test can cut: Cut closes every connection through it and refuses new ones
// (the client sees resets and "connection refused", as when the server's
// host drops off the network); Heal lets connections through again.
// Blackhole is the nastier outage: connections stay open but nothing is
// forwarded either way, so a client finds out only by its own timeouts or
// health checks. After a Blackhole, Heal leaves the connections of the
// outage half-open for good (zombies: open, forwarding nothing, as after a
// NAT or load balancer forgot them) while new ones work: only a client
// that notices a dead connection by itself recovers.
type CutProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	mode    proxyMode
	conns   map[net.Conn]struct{}
	zombies map[net.Conn]bool
	accepts int
	closed  bool
	wg      sync.WaitGroup
}

type proxyMode int

const (
	proxyOpen proxyMode = iota
	proxyCut
	proxyBlackhole
	proxyUnplugged
)

// NewCutProxy listens on 127.0.0.1 and forwards to the apiserver.
func (e *Env) NewCutProxy() (*CutProxy, error) {
	u, err := url.Parse(e.URL)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &CutProxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}, zombies: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Config returns cfg (the apiserver's) pointed at the proxy. The server
// certificate names 127.0.0.1, so TLS verifies as it would directly.
func (p *CutProxy) Config(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Host = "https://" + p.ln.Addr().String()
	return c
}

// Unpluggable is Config with a dialer that, while the proxy is Unplugged,
// fails as a dial does when the client's own network is not up: "connect:
// network is unreachable" (ENETUNREACH), as on a node right after its boot.
// Its transport is not shared with other configs (client-go does not cache
// one with a custom dialer).
func (p *CutProxy) Unpluggable(cfg *rest.Config) *rest.Config {
	c := p.Config(cfg)
	var d net.Dialer
	c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		p.mu.Lock()
		unplugged := p.mode == proxyUnplugged
		p.mu.Unlock()
		if unplugged {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ENETUNREACH)}
		}
		return d.DialContext(ctx, network, addr)
	}
	return c
}

// Unplug drops every connection, as Cut does, and makes the dialer of an
// Unpluggable config fail with "network is unreachable" until Heal.
func (p *CutProxy) Unplug() { p.setMode(proxyUnplugged) }

// Addr is the proxy's listen address.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Accepted is how many client connections the proxy has accepted.
func (p *CutProxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts
}

// Cut drops every connection and refuses new ones until Heal.
func (p *CutProxy) Cut() { p.setMode(proxyCut) }

// Blackhole keeps connections open but forwards nothing until Heal; new
// connections are accepted and hang.
func (p *CutProxy) Blackhole() { p.setMode(proxyBlackhole) }

// Heal lets traffic through again on new connections; connections held
// through a Blackhole stay half-open (see CutProxy).
func (p *CutProxy) Heal() { p.setMode(proxyOpen) }

func (p *CutProxy) setMode(m proxyMode) {
	p.mu.Lock()
	prev := p.mode
	p.mode = m
	var drop []net.Conn
	if m == proxyCut || m == proxyUnplugged {
		for c := range p.conns {
			drop = append(drop, c)
		}
	}
	if m == proxyOpen && prev == proxyBlackhole {
		for c := range p.conns {
			p.zombies[c] = true
		}
	}
	p.mu.Unlock()
	for _, c := range drop {
		_ = c.Close()
	}
}

// Close stops the proxy and closes every connection.
func (p *CutProxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.setMode(proxyCut)
	p.wg.Wait()
}

func (p *CutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == proxyCut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *CutProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.zombies, c)
	p.mu.Unlock()
	_ = c.Close()
}

// dropping reports whether bytes read from c are to be thrown away.
func (p *CutProxy) dropping(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode == proxyBlackhole || p.zombies[c]
}

func (p *CutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepts++
		cut := p.mode == proxyCut || p.mode == proxyUnplugged
		p.mu.Unlock()
		if cut {
			// Refused: a reset right after the handshake, as close as a
			// listener that stays bound can get to ECONNREFUSED.
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.pipe(c)
		}()
	}
}

func (p *CutProxy) pipe(c net.Conn) {
	if !p.track(c) {
		_ = c.Close()
		return
	}
	defer p.untrack(c)
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(up) {
		_ = up.Close()
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !p.dropping(src) {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
}

// String names the proxy for test logs.
func (p *CutProxy) String() string { return fmt.Sprintf("proxy %s -> %s", p.Addr(), p.target) }
