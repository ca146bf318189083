package outboxtest

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy is a TCP proxy on loopback that a test puts between a client and a real server, then cuts
// (every connection dropped, new ones refused) and restores, to play a server outage or a lost
// connection without touching the server; or mutes (what the server sends is held back, what the
// client sends still flows), to play a server that takes requests and never answers.
type Proxy struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	cond   *sync.Cond // signalled when muted, cut or closed change
	cut    bool
	muted  bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
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
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			client.Close()
			server.Close()
			continue
		}
		p.wg.Add(2)
		go p.pipe(server, client)
		go p.pipeFromServer(client, server)
	}
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
// muted, until either connection ends; then it closes both.
func (p *Proxy) pipeFromServer(client, server net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client, server)
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			if !p.waitUnmuted() {
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

// waitUnmuted blocks while the proxy is muted; it reports false once the proxy is cut or closed.
func (p *Proxy) waitUnmuted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.muted && !p.cut && !p.closed {
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

// pipe copies src to dst until either ends, then closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	// io.Copy ends at EOF or on a closed or failed connection: either way the pair is done.
	_, _ = io.Copy(dst, src)
	p.untrack(dst, src)
}
