package drill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"
)

// netns is the partition faults' network namespace: the DB tier runs in
// it, behind a veth pair, so that a queueing discipline can cut it off.
// With loopback set, the tasks named in also run in it too and reach the
// DB tier over the namespace's loopback, which is what is cut: those
// tasks lose the DB tier while the rest of the stack keeps it, and
// everyone still reaches them.
type netns struct {
	name, link     string
	hostIP, nsIP   string
	loopback       bool
	also           []string
	partitionedMu  sync.Mutex
	partitioned    bool
	ipPath, tcPath string
	commandTimeout time.Duration
}

// partitionNet holds every address setupPartition gives: the drill's own,
// on this machine, trusted by its tasks as loopback is (taskTrust).
const partitionNet = "10.201.0.0/16"

// setupPartition creates the namespace and its link: the host's side
// 10.201.N.1, the namespace's 10.201.N.2 (N from the drill's process id).
// Both addresses are on this machine; the namespace has no other route.
func setupPartition(s *stack) (func(), error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root (network namespaces)")
	}
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		return nil, errors.New("needs the ip command (iproute2)")
	}
	tcPath, err := exec.LookPath("tc")
	if err != nil {
		return nil, errors.New("needs the tc command (iproute2)")
	}
	id := os.Getpid() % 250
	n := &netns{name: fmt.Sprintf("triage-drill-%d", os.Getpid()), link: fmt.Sprintf("tdr%d", os.Getpid()%100000),
		hostIP: fmt.Sprintf("10.201.%d.1", id), nsIP: fmt.Sprintf("10.201.%d.2", id), ipPath: ipPath, tcPath: tcPath, commandTimeout: 5 * time.Second}
	undo := func() {
		n.ip("netns", "del", n.name)
		n.ip("link", "del", n.link+"a")
	}
	steps := [][]string{
		{"netns", "add", n.name},
		{"link", "add", n.link + "a", "type", "veth", "peer", "name", n.link + "b"},
		{"link", "set", n.link + "b", "netns", n.name},
		{"addr", "add", n.hostIP + "/30", "dev", n.link + "a"},
		{"link", "set", n.link + "a", "up"},
		{"netns", "exec", n.name, ipPath, "addr", "add", n.nsIP + "/30", "dev", n.link + "b"},
		{"netns", "exec", n.name, ipPath, "link", "set", n.link + "b", "up"},
		{"netns", "exec", n.name, ipPath, "link", "set", "lo", "up"},
	}
	for _, st := range steps {
		if err := n.ip(st...); err != nil {
			undo()
			return nil, err
		}
	}
	s.net = n
	return undo, nil
}

// setupPartitionOne is setupPartition with b-0 in the namespace, cut off
// from the DB tier on the namespace's loopback.
func setupPartitionOne(s *stack) (func(), error) {
	undo, err := setupPartition(s)
	if err != nil {
		return nil, err
	}
	s.net.loopback, s.net.also = true, []string{RoleB + "-0"}
	return undo, nil
}

// runsIn reports whether the task named id runs in the namespace.
func (n *netns) runsIn(role, id string) bool {
	return role == RoleDB || slices.Contains(n.also, id)
}

// ip runs `ip ARGS...`.
func (n *netns) ip(args ...string) error { return n.cmd(n.ipPath, args...) }

// cmd runs a network command, within commandTimeout.
func (n *netns) cmd(path string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.commandTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", path, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// partition cuts (or restores) the link both ways: a blackhole queueing
// discipline on each end of the veth pair (with loopback set, on the
// namespace's loopback) drops every packet in silence, as a partition
// does (open connections stall, new ones wait for their SYN's answer).
// Nothing is routed off the machine.
func (n *netns) partition(on bool) error {
	n.partitionedMu.Lock()
	defer n.partitionedMu.Unlock()
	if on == n.partitioned {
		return nil
	}
	verb := []string{"qdisc", "add", "dev"}
	tail := []string{"root", "blackhole"}
	if !on {
		verb, tail = []string{"qdisc", "del", "dev"}, []string{"root"}
	}
	var err error
	if n.loopback {
		err = n.ip(append(append(append([]string{"netns", "exec", n.name, n.tcPath}, verb...), "lo"), tail...)...)
	} else {
		host := append(append(append([]string{}, verb...), n.link+"a"), tail...)
		ns := append(append(append([]string{"netns", "exec", n.name, n.tcPath}, verb...), n.link+"b"), tail...)
		err = errors.Join(n.cmd(n.tcPath, host...), n.ip(ns...))
	}
	n.partitioned = on
	return err
}

// inNetns returns cmd run in the namespace n (through `ip netns exec`,
// which execs it: the same process, the same death signal).
func inNetns(cmd *exec.Cmd, n *netns) *exec.Cmd {
	out := exec.Command(n.ipPath, append([]string{"netns", "exec", n.name, cmd.Path}, cmd.Args[1:]...)...)
	out.Env, out.Dir = cmd.Env, cmd.Dir
	return out
}

// injectPartition cuts the DB tier off for the window: from tier B and
// the quota service, or with loopback set from the tasks in also only.
func injectPartition(ctx context.Context, dr *driver) {
	n := dr.s.net
	if n == nil {
		return
	}
	if err := n.partition(true); err != nil {
		dr.note("partition: %v", err)
		n.partition(false)
		return
	}
	if n.loopback {
		dr.note("the DB tier cut off from %s", strings.Join(n.also, ", "))
	} else {
		dr.note("the DB tier cut off from tier B (and from the quota service)")
	}
	defer func() {
		if err := n.partition(false); err != nil {
			dr.note("partition not removed: %v", err)
			return
		}
		dr.note("the DB tier reachable again")
	}()
	wait(ctx, dr.sc.fault.window)
}
