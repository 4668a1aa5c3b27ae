package main

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
)

// A process left from another run, still answering on the port a run is
// about to use, is refused rather than measured in place of the one the
// run starts.
func TestStartRefusesAPortAlreadyAnswered(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("needs taskset")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	stop, _, err := config{}.startGroup(context.Background(), "0", t.TempDir(), "upstream", port, "sleep", "5")
	if err == nil {
		stop()
		t.Fatal("started a process on a port another one answers, want an error")
	}
	if !strings.Contains(err.Error(), "still answers") {
		t.Errorf("error %q, want one that says the port still answers", err)
	}
}

// A port the last run's process lets go of within the wait (gunicorn's
// workers outlive their master by a moment) is free.
func TestPortFreedWithinTheWaitIsFree(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	accepted := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		ln.Close() // gone once portFree has seen it answer
		close(accepted)
	}()
	if err := portFree(port, portFreeWait); err != nil {
		t.Fatalf("a port let go of after one connection: %v, want free", err)
	}
	<-accepted
}
