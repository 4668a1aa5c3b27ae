// Package e2e holds triage's end-to-end tests over real loopback sockets:
// an HTTP frontend, two gRPC hops, trusted and untrusted peers.
package e2e
