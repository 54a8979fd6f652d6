package etcdproc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/beaconplane/beacon/internal/lab/freeport"
)

// Network places the members of a cluster. Loopback puts every member on
// 127.0.0.1 with ports from package freeport; a partition cannot be made
// there. Netns puts each member in a network namespace of its own, joined
// by a veth pair to a bridge in the caller's namespace: the caller's
// processes reach every member, members reach each other through the
// bridge, and a member is partitioned away by taking its veth down (its
// packets are then dropped, as on a dead link: no reset, no refusal).
// Processes that are not members get places of their own the same way
// (AddHost), where a drill can change their routes.
type Network struct {
	netns  bool
	slot   int // netns: 10.231.<slot>.0/24 and names bcn<slot>...
	bridge string
	lock   *os.File
	ip     string // path of ip(8)

	mu    sync.Mutex
	hosts []*host
}

// host is one member's place on the network.
type host struct {
	addr  string // IP address members listen on
	ns    string // network namespace ("" on loopback)
	veth  string // host side of its veth pair
	ports map[string]int
}

// Loopback returns a network of loopback addresses.
func Loopback() *Network { return &Network{} }

// ErrNetnsUnavailable is returned by Netns when network namespaces cannot
// be made here; the error says why (not root, no ip command).
var ErrNetnsUnavailable = errors.New("etcdproc: network namespaces unavailable")

// Netns makes a bridge for members in network namespaces. It needs root and
// ip(8) from iproute2. Close removes every namespace, veth and the bridge.
// Each Network takes a slot (a /24 under 10.231.0.0/16 and the name prefix
// bcn<slot>) reserved with a lock file, so that concurrent test processes
// never share one; leftovers of a process that died in the slot are removed
// first.
func Netns() (*Network, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: network namespaces need root (running as uid %d)", ErrNetnsUnavailable, os.Geteuid())
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return nil, fmt.Errorf("%w: the ip command (iproute2) is not installed: apt-get install iproute2", ErrNetnsUnavailable)
	}
	dir := filepath.Join(os.TempDir(), "beacon-drill-netns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	used := localSubnets()
	for slot := 1; slot < 255; slot++ {
		if used[slot] {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(slot)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, err
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close()
			continue
		}
		n := &Network{netns: true, slot: slot, lock: f, ip: ip, bridge: fmt.Sprintf("bcn%db", slot)}
		n.removeLeftovers()
		if err := n.run("link", "add", n.bridge, "type", "bridge"); err != nil {
			// Root without the capability (a container): say so.
			n.Close()
			return nil, fmt.Errorf("%w: %w", ErrNetnsUnavailable, err)
		}
		for _, args := range [][]string{
			{"addr", "add", n.gateway() + "/24", "dev", n.bridge},
			{"link", "set", n.bridge, "up"},
		} {
			if err := n.run(args...); err != nil {
				n.Close()
				return nil, err
			}
		}
		return n, nil
	}
	return nil, fmt.Errorf("%w: no free slot under 10.231.0.0/16", ErrNetnsUnavailable)
}

// localSubnets returns the third octets of the 10.231.x.0/24 networks this
// machine already has addresses in.
func localSubnets() map[int]bool {
	used := map[int]bool{}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if v4 := ipn.IP.To4(); v4 != nil && v4[0] == 10 && v4[1] == 231 {
				used[int(v4[2])] = true
			}
		}
	}
	return used
}

func (n *Network) gateway() string { return fmt.Sprintf("10.231.%d.1", n.slot) }

// IsNetns reports whether members live in network namespaces (and can be
// partitioned).
func (n *Network) IsNetns() bool { return n.netns }

func (n *Network) run(args ...string) error {
	out, err := exec.Command(n.ip, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("etcdproc: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeLeftovers deletes the namespaces and links of this slot that a
// process that died in it left behind.
func (n *Network) removeLeftovers() {
	prefix := fmt.Sprintf("bcn%d", n.slot)
	if out, err := exec.Command(n.ip, "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			if isSlotName(name, prefix) {
				_ = exec.Command(n.ip, "netns", "del", name).Run()
			}
		}
	}
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if isSlotName(i.Name, prefix) {
			_ = exec.Command(n.ip, "link", "del", i.Name).Run()
		}
	}
}

// isSlotName reports whether name is one of the names of a slot:
// prefix followed by 'b' (bridge), 'n<i>' (namespace) or 'h<i>' (veth).
func isSlotName(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" {
		return false
	}
	switch rest[0] {
	case 'b':
		return len(rest) == 1
	case 'n', 'h', 'm':
		_, err := strconv.Atoi(rest[1:])
		return err == nil
	}
	return false
}

// addHost gives a new member its place: a loopback address with free ports
// (client, peer, http), or a namespace with its own address.
func (n *Network) addHost() (*host, error) {
	n.mu.Lock()
	i := len(n.hosts)
	h := &host{ports: map[string]int{}}
	n.hosts = append(n.hosts, h)
	n.mu.Unlock()
	if !n.netns {
		h.addr = "127.0.0.1"
		for _, name := range []string{"client", "peer", "http"} {
			p, err := freeport.Port()
			if err != nil {
				return nil, err
			}
			h.ports[name] = p
		}
		return h, nil
	}
	// Alone on its address: etcd's usual ports are free there.
	h.addr = fmt.Sprintf("10.231.%d.%d", n.slot, 10+i)
	h.ports = map[string]int{"client": 2379, "peer": 2380, "http": 9379}
	h.ns = fmt.Sprintf("bcn%dn%d", n.slot, i)
	h.veth = fmt.Sprintf("bcn%dh%d", n.slot, i)
	inner := fmt.Sprintf("bcn%dm%d", n.slot, i)
	for _, args := range [][]string{
		{"netns", "add", h.ns},
		{"link", "add", h.veth, "type", "veth", "peer", "name", inner},
		{"link", "set", inner, "netns", h.ns},
		{"link", "set", h.veth, "master", n.bridge},
		{"link", "set", h.veth, "up"},
		{"-n", h.ns, "addr", "add", h.addr + "/24", "dev", inner},
		{"-n", h.ns, "link", "set", inner, "up"},
		{"-n", h.ns, "link", "set", "lo", "up"},
	} {
		if err := n.run(args...); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// wrap makes cmd run in h's namespace (ip netns exec replaces itself with
// the command, so the process is the command's).
func (n *Network) wrap(h *host, cmd *exec.Cmd) {
	if h.ns == "" {
		return
	}
	cmd.Args = append([]string{n.ip, "netns", "exec", h.ns, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = n.ip
}

// Host is a place of its own on a Network for a process that is not a
// member (a server the drill probes, a client, a beacon serve over the
// cluster): on a Netns network, a namespace with its own address on the
// bridge; on Loopback, 127.0.0.1. Close of the Network removes it.
type Host struct {
	n *Network
	h *host
}

// AddHost gives a new process its place on the network.
func (n *Network) AddHost() (*Host, error) {
	h, err := n.addHost()
	if err != nil {
		return nil, err
	}
	return &Host{n: n, h: h}, nil
}

// Addr is the host's IP address: processes on it listen there.
func (h *Host) Addr() string { return h.h.addr }

// Wrap makes cmd run on the host: in its namespace (through ip netns
// exec, which becomes the command: cmd's process is the command's).
func (h *Host) Wrap(cmd *exec.Cmd) { h.n.wrap(h.h, cmd) }

// IP runs ip(8) with args in the host's namespace — `route add blackhole
// 10.231.1.11/32` drops its packets to that address, as a partition does
// — saying what failed. It needs a Netns network.
func (h *Host) IP(args ...string) error {
	if h.h.ns == "" {
		return errors.New("etcdproc: a host's routes need network namespaces (run as root with iproute2)")
	}
	return h.n.run(append([]string{"-n", h.h.ns}, args...)...)
}

// Namespaces are the network namespaces of the hosts added so far (none
// on loopback).
func (n *Network) Namespaces() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, h := range n.hosts {
		if h.ns != "" {
			out = append(out, h.ns)
		}
	}
	return out
}

// Gateway is the caller's address on a Netns network's bridge: where
// processes on its hosts reach the caller's own namespace ("" on
// Loopback, where everything is on 127.0.0.1).
func (n *Network) Gateway() string {
	if !n.netns {
		return ""
	}
	return n.gateway()
}

// setLink takes h's link down (partition) or up (heal).
func (n *Network) setLink(h *host, up bool) error {
	if h.ns == "" {
		return errors.New("etcdproc: partitions need network namespaces (run as root with iproute2)")
	}
	state := "down"
	if up {
		state = "up"
	}
	return n.run("link", "set", h.veth, state)
}

// Close removes the namespaces, veths and the bridge, and frees the slot.
// It is idempotent.
func (n *Network) Close() {
	if !n.netns {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lock == nil {
		return
	}
	for _, h := range n.hosts {
		if h.veth != "" {
			_ = exec.Command(n.ip, "link", "del", h.veth).Run()
		}
		if h.ns != "" {
			_ = exec.Command(n.ip, "netns", "del", h.ns).Run()
		}
	}
	_ = exec.Command(n.ip, "link", "del", n.bridge).Run()
	n.lock.Close()
	n.lock = nil
}
