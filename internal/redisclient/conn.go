package redisclient

import "fmt"

// Server is the url key of a Redis component's options, defined once for
// every Redis transport (each embeds it, through an alias of its own so
// that an embedder outside this module can write the literal).
type Server struct {
	// URL is the Redis URL (redis://, rediss:// for TLS, user:password@
	// for AUTH, /db); default: the deployment's REDIS_URL (each transport
	// says what applies without either). In cluster mode, go-redis's
	// cluster form is accepted too: redis://host:port?addr=host2:port2
	// (any node finds the others); in sentinel mode the URL's host is a
	// sentinel.
	URL string `json:"url,omitempty"`
}

// TopologyOptions are the mode, addrs and master_name keys of a Redis
// transport's options (upstream's), defined once; Parse reads them into a
// Topology with its rules. When none of them is set, the transport takes
// the deployment's redis_mode, redis_addrs and redis_master_name as a
// whole (see Or), never a mix of both.
type TopologyOptions struct {
	// Mode is "single" (one server, the default; upstream's "standalone"
	// too), "cluster" (a Redis Cluster) or "sentinel" (the URL's host is a
	// sentinel; the client follows the master of MasterName through
	// failovers). A transport may refuse one (redis-pubsub: cluster).
	Mode string `json:"mode,omitempty"`
	// Addrs are more cluster nodes or sentinels beside the URL's host
	// (upstream's addrs): cluster or sentinel mode only.
	Addrs []string `json:"addrs,omitempty"`
	// MasterName is the name the sentinels monitor the master under
	// (upstream's master_name): required in sentinel mode, refused
	// otherwise.
	MasterName string `json:"master_name,omitempty"`
}

// IsZero reports whether none of mode, addrs and master_name is set.
func (o TopologyOptions) IsZero() bool {
	return o.Mode == "" && len(o.Addrs) == 0 && o.MasterName == ""
}

// Or returns o, or def when o sets none of its keys.
func (o TopologyOptions) Or(def TopologyOptions) TopologyOptions {
	if o.IsZero() {
		return def
	}
	return o
}

// Parse reads and validates the keys (ParseTopology); its error names them.
func (o TopologyOptions) Parse() (Topology, error) {
	t, err := ParseTopology(o.Mode, o.Addrs, o.MasterName)
	if err != nil {
		return t, fmt.Errorf("mode, addrs, master_name: %w", err)
	}
	return t, nil
}
