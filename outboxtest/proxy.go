package outboxtest

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy is a TCP proxy on loopback that a test puts between a client and a real server, then cuts
// (every connection dropped, new ones refused) and restores, to play a server outage or a lost
// connection without touching the server.
type Proxy struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	cut    bool
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
		go p.pipe(client, server)
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

// pipe copies src to dst until either ends, then closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	// io.Copy ends at EOF or on a closed or failed connection: either way the pair is done.
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
