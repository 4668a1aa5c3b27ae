package triagegrpc

import "google.golang.org/grpc"

// UnaryInterceptor is the unary interceptor DialOptions installs, for
// benchmarks that call it without a connection.
func (c *Client) UnaryInterceptor() grpc.UnaryClientInterceptor { return c.unary(c.keepSC) }
