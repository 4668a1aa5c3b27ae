package intake

// SenderLate reports whether h's first message came late (senderLate), for
// the tests of the connection policy.
func SenderLate(h *Handle) bool { return h.senderLate() }

// Stalled returns how many of c's requests are stalled, for the tests of
// the connection policy.
func Stalled(c *Conn) int { return c.stalled() }
