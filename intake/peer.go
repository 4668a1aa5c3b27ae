package intake

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// DefaultMaxPeers bounds the peers whose requests the Intake counts at
// once (WithPeerShare): a peer is followed while it has a request in the
// task; past the bound, a new peer's requests are not counted, and never
// over its share.
const DefaultMaxPeers = 1 << 16

// WithPeerShare sets how many requests of one untrusted peer (its
// address, trust.Peer) may be in the task at once, admitted and not
// finished, before its next ones are over its share: they may take only
// the first half of the task's room (admission.OverShare), so that
// however many connections a peer opens and however its requests stall,
// the second half of the room stays for the others. A trusted peer (a
// proxy of yours, carrying many callers) is not counted. The count is
// O(1) per request, at most DefaultMaxPeers peers. 0 turns it off.
// Default: off.
func WithPeerShare(n int) Option {
	return optionFunc(func(in *Intake) {
		in.peerShare = int32(min(max(n, 0), 1<<30))
		if in.peerShare > 0 && in.peers == nil {
			in.peers = &peers{n: map[netip.Addr]int32{}, max: DefaultMaxPeers}
		}
	})
}

// peers counts each untrusted peer's requests in the task.
type peers struct {
	mu  sync.Mutex
	n   map[netip.Addr]int32 // only peers with a request in the task
	max int
}

// enter counts a request of addr; over says the peer held share or more
// before it, counted that the request was counted (not past the bound).
func (p *peers) enter(addr netip.Addr, share int32) (over, counted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.n[addr]
	if !ok && len(p.n) >= p.max {
		return false, false
	}
	p.n[addr] = n + 1
	return n >= share, true
}

// leave uncounts a request of addr.
func (p *peers) leave(addr netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.n[addr] - 1; n > 0 {
		p.n[addr] = n
	} else {
		delete(p.n, addr)
	}
}

// peerMark is what an admitted request holds of its peer's count; it is
// left once.
type peerMark struct {
	p       *peers
	addr    netip.Addr
	counted atomic.Bool
}

func (m *peerMark) leave() {
	if m.p != nil && m.counted.CompareAndSwap(true, false) {
		m.p.leave(m.addr)
	}
}
