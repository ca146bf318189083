package outboxtest

import (
	"fmt"
	"net"
	"sync"
)

// Proxy is a TCP proxy on loopback that a test puts between a client and a real server, then cuts
// (every connection dropped, new ones refused) and restores, to play a server outage or a lost
// connection without touching the server; mutes (what the server sends is held back, what the
// client sends still flows), to play a server that takes requests and never answers; or black-holes
// (nothing flows either way and nothing is closed), to play a network partition that drops packets
// instead of resetting connections.
type Proxy struct {
	target string
	ln     net.Listener

	mu         sync.Mutex
	cond       *sync.Cond // signalled when muted, cut or closed change
	cut        bool
	muted      bool
	blackholed bool
	closed     bool
	conns      map[net.Conn]struct{}
	wg         sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards each connection to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("outboxtest: proxy: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address, host:port, to give the client instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut drops every open connection and refuses new ones (they are accepted and closed at once) until
// Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
}

// Mute holds back, while on, everything the server sends on open and new connections (it is
// delivered when Mute(false) comes); what the client sends still reaches the server.
func (p *Proxy) Mute(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.muted = on
	p.cond.Broadcast()
}

// Blackhole, while on, forwards nothing in either direction on open connections and leaves new ones
// accepted but unanswered, closing nothing: what each side sends waits, as packets a partitioned
// network drops would, and is delivered when Blackhole(false) comes (TCP's retransmission after the
// partition heals). A client sees its statements hang, not fail, until its own timeouts.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackholed = on
	p.cond.Broadcast()
}

// Restore forwards new connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Close stops the proxy: the listener and every connection are closed, and Close returns once its
// goroutines have ended.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			client.Close()
			continue
		}
		p.wg.Add(1)
		go p.connect(client)
	}
}

// connect dials the server for a client that connected, once no black hole is in the way.
func (p *Proxy) connect(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) || !p.waitForward(false) {
		p.untrack(client, client)
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		p.untrack(client, client)
		return
	}
	if !p.track(server) {
		p.untrack(client, server)
		return
	}
	p.wg.Add(2)
	go p.pipe(server, client)
	go p.pipeFromServer(client, server)
}

// track registers a connection pair unless the proxy was cut or closed meanwhile.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipeFromServer copies what the server sends to the client, holding it back while the proxy is
// muted or black-holed, until either connection ends; then it closes both.
func (p *Proxy) pipeFromServer(client, server net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client, server)
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			if !p.waitForward(true) {
				return
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitForward blocks while the proxy holds back what flows in one direction (from the server: muted
// or black-holed; to it: black-holed); it reports false once the proxy is cut or closed.
func (p *Proxy) waitForward(fromServer bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for (p.blackholed || fromServer && p.muted) && !p.cut && !p.closed {
		p.cond.Wait()
	}
	return !p.cut && !p.closed
}

// untrack closes a connection pair and forgets it.
func (p *Proxy) untrack(a, b net.Conn) {
	a.Close()
	b.Close()
	p.mu.Lock()
	delete(p.conns, a)
	delete(p.conns, b)
	p.mu.Unlock()
}

// pipe copies what the client (src) sends to the server (dst), holding it back while the proxy is
// black-holed, until either connection ends; then it closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.untrack(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitForward(false) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
