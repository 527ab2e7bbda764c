package redistest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy in front of a Redis that loses replies on purpose:
// the command reaches Redis and runs, and its reply is held back
// (HoldNext), or dropped together with the client's connection (DropNext),
// as when a balancer, a proxy or a network blip resets a connection at
// the wrong moment. Freeze makes Redis look frozen to the proxy's clients
// only; Cut cuts them off from it, as a network partition does. Commands are matched by the bytes of their RESP encoding, so a
// rule naming a key and a path picks one script run of one document.
//
// A Proxy relies on its clients sending one command at a time per
// connection (go-redis does, outside pipelines): the first reply bytes
// after a matched command are that command's reply. All methods are safe
// for concurrent use.
type Proxy struct {
	target string
	addr   string

	mu    sync.Mutex // protects rules
	rules []*rule    // armed one-shot rules, oldest first

	freeze atomic.Bool
	cut    atomic.Bool
}

// rule is one armed HoldNext or DropNext.
type rule struct {
	match   [][]byte
	drop    bool          // drop the reply and the connection; else hold it until release
	fired   chan struct{} // closed when the command has run and its reply was held or dropped
	release chan struct{} // hold only: closed to let the reply through
	once    sync.Once
}

// StartProxy starts a proxy to target (host:port) on a free loopback
// port; it stops when t ends, after releasing every held reply.
func StartProxy(t TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{target: target, addr: ln.Addr().String()}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, r := range p.rules {
			r.unhold()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

// URL is the proxy's address as a redis URL for database 0.
func (p *Proxy) URL() string { return "redis://" + p.addr + "/0" }

// DropNext arms a one-shot rule: the next command whose encoding contains
// every one of match is forwarded to Redis, and once Redis has answered
// it, the reply is discarded and the client's connection closed. The
// returned channel is closed then: the command ran, its client saw EOF.
func (p *Proxy) DropNext(match ...string) <-chan struct{} {
	return p.arm(true, match).fired
}

// HoldNext arms a one-shot rule: the next command whose encoding contains
// every one of match runs, and its reply is held back until release is
// called (or the test ends). fired is closed when the reply is held.
func (p *Proxy) HoldNext(match ...string) (fired <-chan struct{}, release func()) {
	r := p.arm(false, match)
	return r.fired, r.unhold
}

// Freeze holds back every reply on every connection while on: Redis looks
// frozen to this proxy's clients only.
func (p *Proxy) Freeze(on bool) { p.freeze.Store(on) }

// Cut discards every byte in both directions while on, as a network
// partition does: commands never reach Redis, replies never come back.
// A connection that lost bytes is closed at its next byte once Cut is
// off.
func (p *Proxy) Cut(on bool) { p.cut.Store(on) }

// lost reports whether b is to be discarded (Cut is on), and whether the
// connection lost bytes to a cut and must be closed.
func (p *Proxy) lost(tainted *atomic.Bool) (discard, closeConn bool) {
	if p.cut.Load() {
		tainted.Store(true)
		return true, false
	}
	return false, tainted.Load()
}

func (p *Proxy) arm(drop bool, match []string) *rule {
	r := &rule{drop: drop, fired: make(chan struct{}), release: make(chan struct{})}
	for _, m := range match {
		r.match = append(r.match, []byte(m))
	}
	p.mu.Lock()
	p.rules = append(p.rules, r)
	p.mu.Unlock()
	return r
}

func (r *rule) unhold() { r.once.Do(func() { close(r.release) }) }

// take removes and returns the oldest armed rule that b matches.
func (p *Proxy) take(b []byte) *rule {
	p.mu.Lock()
	defer p.mu.Unlock()
next:
	for i, r := range p.rules {
		for _, m := range r.match {
			if !bytes.Contains(b, m) {
				continue next
			}
		}
		p.rules = append(p.rules[:i], p.rules[i+1:]...)
		return r
	}
	return nil
}

func (p *Proxy) pipe(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	var pending atomic.Pointer[rule] // a matched command whose reply is on its way
	var tainted atomic.Bool          // bytes were lost to a cut
	go func() {
		defer s.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if discard, closeConn := p.lost(&tainted); discard {
				continue
			} else if closeConn {
				return
			}
			if r := p.take(buf[:n]); r != nil {
				pending.Store(r)
			}
			if _, err := s.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if err != nil {
			return
		}
		if discard, closeConn := p.lost(&tainted); discard {
			continue
		} else if closeConn {
			return
		}
		if r := pending.Swap(nil); r != nil {
			close(r.fired)
			if r.drop {
				return // the deferred Close drops the reply with the connection
			}
			<-r.release
		}
		for p.freeze.Load() {
			time.Sleep(5 * time.Millisecond) // polling a test switch, off the code under test
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}
