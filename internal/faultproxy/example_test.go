package faultproxy_test

import (
	"fmt"
	"net"
	"time"

	"github.com/throttlehq/throttle/internal/faultproxy"
)

// A test points its client at the proxy instead of the server, then injects
// faults while the client runs.
func Example() {
	server, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer server.Close()

	p, err := faultproxy.New(server.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()

	// ... start the client on p.Addr() ...
	p.SetLatency(20 * time.Millisecond) // a slow network
	p.Block()                           // a partition: silence, no errors
	p.Unblock()
	p.Cut() // every connection reset, as by a server restart
	fmt.Println(p.Target() == server.Addr().String())
	// Output: true
}
