package testenv

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// PGProxy forwards connections to a PostgreSQL server and can cut one
// between a COMMIT and its reply: the transaction has committed, and the
// client never hears it. Connect through URL (a plain-text connection:
// sslmode=disable).
type PGProxy struct {
	URL    string
	target string
	ln     net.Listener

	drops   atomic.Int32 // COMMIT replies still to drop
	dropped atomic.Int32
	// refuseAfterDrop: once a reply is dropped, new connections are
	// closed at once until Accept is called.
	refuseAfterDrop atomic.Bool
	refusing        atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// StartPGProxy starts a proxy to the server dbURL names; URL is dbURL
// through the proxy. It stops when the test ends.
func StartPGProxy(t testing.TB, dbURL string) *PGProxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("proxy: parse %q: %v", dbURL, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &PGProxy{target: u.Host, ln: ln, conns: map[net.Conn]bool{}}
	u.Host = ln.Addr().String()
	p.URL = u.String()
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// DropCommitReplies makes the proxy drop the reply to the next n COMMITs,
// closing their connections in its place. With refuse, each drop also
// closes every other connection, and those made after it until Accept is
// called, so that the client cannot ask the server what happened.
func (p *PGProxy) DropCommitReplies(n int, refuse bool) {
	p.refuseAfterDrop.Store(refuse)
	p.drops.Store(int32(n))
}

// Dropped counts the COMMIT replies dropped so far.
func (p *PGProxy) Dropped() int { return int(p.dropped.Load()) }

// Accept lets new connections through again after a drop that refused
// them.
func (p *PGProxy) Accept() { p.refusing.Store(false) }

func (p *PGProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refusing.Load() {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(s, c)
			p.cut(c, s)
		}()
		go func() {
			defer p.wg.Done()
			p.replies(c, s)
			p.cut(c, s)
		}()
	}
}

// replies forwards the server's messages to the client, one at a time,
// until a COMMIT's reply is to be dropped. After startup every message
// from the server is a type byte and a length that counts itself.
func (p *PGProxy) replies(client, server net.Conn) {
	r := bufio.NewReader(server)
	w := bufio.NewWriter(client)
	head := make([]byte, 5)
	var body []byte
	for {
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
		if _, err := io.ReadFull(r, head); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[1:])) - 4
		if n < 0 {
			return
		}
		if cap(body) < n {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if head[0] == 'C' && string(body) == "COMMIT\x00" && p.takeDrop() {
			return // the COMMIT has landed; its reply never arrives
		}
		if _, err := w.Write(head); err != nil {
			return
		}
		if _, err := w.Write(body); err != nil {
			return
		}
	}
}

func (p *PGProxy) takeDrop() bool {
	for {
		n := p.drops.Load()
		if n <= 0 {
			return false
		}
		if p.drops.CompareAndSwap(n, n-1) {
			if p.refuseAfterDrop.Load() {
				p.refusing.Store(true)
				p.mu.Lock()
				for c := range p.conns {
					c.Close()
				}
				p.mu.Unlock()
			}
			p.dropped.Add(1)
			return true
		}
	}
}

// cut closes both ends of a proxied connection.
func (p *PGProxy) cut(client, server net.Conn) {
	client.Close()
	server.Close()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

func (p *PGProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
