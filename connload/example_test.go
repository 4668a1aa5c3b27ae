package connload_test

import (
	"fmt"
	"net"

	"github.com/triagehq/triage/connload"
)

// A task's listener with its connections bounded: at most 100 new ones a
// second (bursts of 20) and 5,000 open; a server serves it as its
// listener, and its open count can be an admission signal.
func ExampleNewListener() {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	l, err := connload.NewListener(raw, connload.WithAcceptRate(100, 20), connload.WithMaxOpen(5000))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	c, _ := net.Dial("tcp", l.Addr().String())
	defer c.Close()
	s, _ := l.Accept()
	defer s.Close()
	fmt.Printf("%s: %d open, %.4f of the maximum\n", l.Name(), l.Stats().Open, l.Utilization())
	// Output: connections: 1 open, 0.0002 of the maximum
}
