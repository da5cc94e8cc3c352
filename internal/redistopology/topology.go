// Package redistopology holds the rules of a Redis topology — the mode names
// and which of addrs and master_name each mode needs — without go-redis,
// so that core/config checks the deployment's redis_mode, redis_addrs and
// redis_master_name with the same rules (and words) as
// internal/redisclient checks a component's mode, addrs and master_name.
// It imports only the standard library, so it stands on the ground floor
// with internal/mutant: core may link it (core/app's TestLinksOnlyCore
// names both) and nothing in internal/ imports core. The rules are upstream's (llm-d-async
// after #491): addrs need cluster
// or sentinel, master_name needs sentinel, sentinel needs master_name, and
// every address is host:port.
package redistopology

import (
	"fmt"
	"net"
	"strings"
)

// Mode is how a Redis URL is reached.
type Mode string

// Modes.
const (
	// Single is one server (default): every key on one node.
	Single Mode = "single"
	// Cluster is a Redis Cluster: keys spread over the nodes by hash slot;
	// the client follows MOVED/ASK redirections and failovers.
	Cluster Mode = "cluster"
	// Sentinel is one master with replicas watched by Redis Sentinel: the
	// client asks the sentinels for the master of the master name and
	// follows it when they promote a replica. Keys are as in Single.
	Sentinel Mode = "sentinel"
)

// modes is the wording of errors about a mode.
const modes = "single (or standalone), cluster or sentinel"

// ParseMode reads a mode, ignoring case and surrounding space; "" is
// Single, and "standalone" (upstream's name) is accepted for it.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "single", "standalone":
		return Single, nil
	case "cluster":
		return Cluster, nil
	case "sentinel":
		return Sentinel, nil
	}
	return "", fmt.Errorf("redis mode %q: want %s", s, modes)
}

// Keys are the names the three settings go by where they are written, so
// that a problem names them as the reader wrote them.
type Keys struct {
	Mode, Addrs, MasterName string
}

// Options are the keys of a component's options (a Redis transport's, or
// the gates' after their redis_ prefix): mode, addrs, master_name.
var Options = Keys{Mode: "mode", Addrs: "addrs", MasterName: "master_name"}

// Problem is one broken rule: Key is the key at fault (one of Keys), What
// says why.
type Problem struct {
	Key, What string
}

func (p Problem) String() string { return p.Key + ": " + p.What }

// Check reads mode (see ParseMode) and checks addrs and masterName
// (surrounding space ignored) against it. It returns the mode read and
// every problem, named by k; with an unknown mode that is the only problem
// (and the mode is "").
func Check(k Keys, mode string, addrs []string, masterName string) (Mode, []Problem) {
	m, err := ParseMode(mode)
	if err != nil {
		return "", []Problem{{k.Mode, fmt.Sprintf("%q: want %s", mode, modes)}}
	}
	var ps []Problem
	add := func(key, format string, a ...any) { ps = append(ps, Problem{key, fmt.Sprintf(format, a...)}) }
	masterName = strings.TrimSpace(masterName)
	switch {
	case m == Sentinel && masterName == "":
		add(k.Mode, "sentinel needs %s (the name the sentinels monitor the master under)", k.MasterName)
	case m != Sentinel && masterName != "":
		add(k.MasterName, "%q needs %s sentinel (the mode is %s)", masterName, k.Mode, m)
	}
	if m == Single && len(addrs) > 0 {
		add(k.Addrs, "%v need %s cluster or sentinel (the mode is single)", addrs, k.Mode)
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			add(k.Addrs, "%q is not host:port", a)
		}
	}
	return m, ps
}
