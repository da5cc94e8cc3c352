package redissortedset

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// Defaults of Options.
const (
	DefaultPollIntervalMS = 1000
	DefaultBatchSize      = 256
	MinBatchSize          = 64
	MaxBatchSize          = 1000
	DefaultLeaseMS        = 15000
	DefaultMaxDeliveries  = 5
	// maxHeartbeatMS caps the default heartbeat, as upstream clamps its own
	// (lease/3 within [1 s, 30 s]).
	maxHeartbeatMS = 30000
	// maxReclaimIntervalMS caps the default reclaim interval at upstream's
	// default (claim_reclaim_interval_ms 15000).
	maxReclaimIntervalMS = 15000
)

// Server is the url key of the options, shared by the Redis transports.
type Server = redisclient.Server

// TopologyOptions are the mode, addrs and master_name keys of the options,
// shared by the Redis transports.
type TopologyOptions = redisclient.TopologyOptions

// Options are the transport's options (the transport config object minus
// queues and result_queue_name). Unknown options are errors.
type Options struct {
	// Server is the url key (redisclient.Server): default the deployment's
	// REDIS_URL, and no Redis URL at all is an error.
	Server
	// TopologyOptions are the mode, addrs and master_name keys
	// (redisclient.TopologyOptions). In cluster mode the keys of a queue
	// are hash-tagged into one slot, and queues spread over the nodes.
	TopologyOptions
	// MinReplicasAcked, when above 0, makes every result write wait (Redis
	// WAIT) until that many replicas of the queue's master hold it before
	// the request is acked; with it a failover loses no result and repeats
	// none. 0 (default): the write is acked when the master has it; Redis
	// replication is asynchronous, so a master that dies before passing it
	// on can lose it (the request then runs again; see
	// docs/redis-sortedset.md).
	MinReplicasAcked int `json:"min_replicas_acked,omitempty"`
	// MinReplicasTimeoutMS bounds the wait for replicas (default 1000). A
	// write still short of them then counts as written (it is on the
	// master and cannot be taken back), with a warning and the event
	// replica_shortfalls: a master left without replicas does not stop
	// its queues.
	MinReplicasTimeoutMS int `json:"min_replicas_timeout_ms,omitempty"`
	// Prefix is the global key prefix (default llm-d-async).
	Prefix string `json:"prefix,omitempty"`
	// PollIntervalMS is the longest idle wait between two claims on an empty
	// queue (default 1000). A queue with work is claimed again at once, and a
	// producer's enqueue wakes an idle queue at once.
	PollIntervalMS int `json:"poll_interval_ms,omitempty"`
	// BatchSize is the most requests claimed per round trip (default 256).
	// Values below 64 (upstream's default is 10) are raised to 64 so that a
	// legacy setting does not cripple throughput; at most 1000.
	BatchSize int `json:"batch_size,omitempty"`
	// Prefetch is how many requests a queue may hold claimed ahead of its
	// free credits while it is busy (its last claim came back full), so that
	// when a request's gateway call ends the next one starts without
	// waiting for a claim's round trip. 0: the queue's concurrency, at most
	// BatchSize; -1: none. Requests held ahead are leased (the
	// heartbeat renews them), are not dispatched before a credit frees, and
	// go back to the queue when no credit freed for a second or the queue
	// stops.
	Prefetch int `json:"prefetch,omitempty"`
	// LeaseMS is how long a claim holds a request without a heartbeat
	// (default 15000). A crashed replica's requests are back in the queue
	// within LeaseMS + ReclaimIntervalMS.
	LeaseMS int `json:"lease_ms,omitempty"`
	// ClaimLeaseTTLSeconds is upstream's name of the lease, in seconds
	// (claim_lease_ttl_seconds; upstream's default is 300): when set it is
	// the lease (LeaseMS = 1000 × it). 0 means unset; negative is an error,
	// and so is a lease_ms that says otherwise.
	ClaimLeaseTTLSeconds int `json:"claim_lease_ttl_seconds,omitempty"`
	// HeartbeatMS is how often leases in flight are renewed (default
	// LeaseMS/3, at most 30 s as upstream's heartbeat).
	HeartbeatMS int `json:"heartbeat_ms,omitempty"`
	// ReclaimIntervalMS is how often expired claims are returned to the
	// queue (default LeaseMS/3, at most 15 s as upstream's default).
	ReclaimIntervalMS int `json:"reclaim_interval_ms,omitempty"`
	// ClaimReclaimIntervalMS is upstream's name of ReclaimIntervalMS
	// (claim_reclaim_interval_ms; upstream's default is 15000): when set it
	// is the reclaim interval. 0 means unset; negative is an error, and so
	// is a reclaim_interval_ms that says otherwise.
	ClaimReclaimIntervalMS int `json:"claim_reclaim_interval_ms,omitempty"`
	// MaxDeliveries is how many times a request may be claimed and lost
	// (lease expired) before it is dead-lettered with an INFERENCE_ERROR
	// result (default 5).
	MaxDeliveries int `json:"max_deliveries,omitempty"`
	// ResultRetryMS bounds the retries of a result write while Redis is
	// unreachable (default LeaseMS); the request stays leased meanwhile.
	ResultRetryMS int `json:"result_retry_ms,omitempty"`
	// RetryQueueName names each queue's delay set; "{queue}" stands for the
	// request queue (default "{queue}:delayed"). A flat name without
	// "{queue}" (upstream's form, whose default "retry-sortedset" is one set
	// shared by every queue) is accepted: sluice keeps one delay set per
	// queue, so SetDefaults turns it into "{queue}:<name>" and keeps the
	// name as given in UpstreamRetryQueueName.
	RetryQueueName string `json:"retry_queue_name,omitempty"`
	// UpstreamRetryQueueName is a flat retry_queue_name as the config gave
	// it (set by SetDefaults; empty for a template or no name): the shared
	// retry set upstream writes, whose due entries the transport moves back
	// into the queues it serves (see UpstreamRetrySet; when empty, upstream's
	// default DefaultUpstreamRetryQueueName is adopted).
	UpstreamRetryQueueName string `json:"-"`
	// PoolSize is the Redis connection pool size (default: go-redis' default).
	PoolSize int `json:"pool_size,omitempty"`
	// TLSCACert, TLSCert and TLSKey are PEM files for rediss://.
	TLSCACert string `json:"tls_ca_cert,omitempty"`
	TLSCert   string `json:"tls_cert,omitempty"`
	TLSKey    string `json:"tls_key,omitempty"`
	// TLSInsecureSkipVerify skips verifying the server's certificate (testing only).
	TLSInsecureSkipVerify bool `json:"tls_insecure_skip_verify,omitempty"`
	// TLSServerName overrides the name verified in the server's certificate.
	TLSServerName string `json:"tls_server_name,omitempty"`

	// deploymentTLS is the deployment's redis_tls (transport.Env.RedisTLS),
	// used for rediss:// when none of the tls_* options above is set.
	deploymentTLS *tls.Config
}

// SetDefaults fills unset fields.
func (o *Options) SetDefaults() {
	if o.PollIntervalMS <= 0 {
		o.PollIntervalMS = DefaultPollIntervalMS
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	o.BatchSize = min(max(o.BatchSize, MinBatchSize), MaxBatchSize)
	if o.LeaseMS <= 0 && o.ClaimLeaseTTLSeconds > 0 {
		o.LeaseMS = o.ClaimLeaseTTLSeconds * 1000
	}
	if o.LeaseMS <= 0 {
		o.LeaseMS = DefaultLeaseMS
	}
	if o.HeartbeatMS <= 0 {
		o.HeartbeatMS = min(max(o.LeaseMS/3, 1), maxHeartbeatMS)
	}
	if o.ReclaimIntervalMS <= 0 && o.ClaimReclaimIntervalMS > 0 {
		o.ReclaimIntervalMS = o.ClaimReclaimIntervalMS
	}
	if o.ReclaimIntervalMS <= 0 {
		o.ReclaimIntervalMS = min(max(o.LeaseMS/3, 1), maxReclaimIntervalMS)
	}
	if o.MaxDeliveries <= 0 {
		o.MaxDeliveries = DefaultMaxDeliveries
	}
	if o.ResultRetryMS <= 0 {
		o.ResultRetryMS = o.LeaseMS
	}
	if o.MinReplicasTimeoutMS <= 0 {
		o.MinReplicasTimeoutMS = 1000
	}
	if o.RetryQueueName != "" && !strings.Contains(o.RetryQueueName, keys.QueuePlaceholder) {
		o.UpstreamRetryQueueName = o.RetryQueueName
		o.RetryQueueName = keys.QueuePlaceholder + ":" + o.RetryQueueName
	}
}

// Validate reports unusable options (after SetDefaults).
func (o *Options) Validate() error {
	var errs []error
	if o.ClaimLeaseTTLSeconds < 0 {
		errs = append(errs, fmt.Errorf("claim_lease_ttl_seconds %d must be non-negative", o.ClaimLeaseTTLSeconds))
	} else if o.ClaimLeaseTTLSeconds > 0 && o.LeaseMS != o.ClaimLeaseTTLSeconds*1000 {
		errs = append(errs, fmt.Errorf("claim_lease_ttl_seconds %d and lease_ms %d disagree: give one", o.ClaimLeaseTTLSeconds, o.LeaseMS))
	}
	if o.ClaimReclaimIntervalMS < 0 {
		errs = append(errs, fmt.Errorf("claim_reclaim_interval_ms %d must be non-negative", o.ClaimReclaimIntervalMS))
	} else if o.ClaimReclaimIntervalMS > 0 && o.ReclaimIntervalMS != o.ClaimReclaimIntervalMS {
		errs = append(errs, fmt.Errorf("claim_reclaim_interval_ms %d and reclaim_interval_ms %d disagree: give one", o.ClaimReclaimIntervalMS, o.ReclaimIntervalMS))
	}
	if o.HeartbeatMS >= o.LeaseMS {
		errs = append(errs, fmt.Errorf("heartbeat_ms %d must be below lease_ms %d", o.HeartbeatMS, o.LeaseMS))
	}
	if o.RetryQueueName != "" && !strings.Contains(o.RetryQueueName, keys.QueuePlaceholder) {
		errs = append(errs, fmt.Errorf("retry_queue_name %q must contain %s (one delay set per queue)", o.RetryQueueName, keys.QueuePlaceholder))
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		errs = append(errs, errors.New("tls_cert and tls_key go together"))
	}
	if o.PoolSize < 0 {
		errs = append(errs, errors.New("pool_size must not be negative"))
	}
	if o.Prefetch < -1 || o.Prefetch > MaxBatchSize {
		errs = append(errs, fmt.Errorf("prefetch %d must be -1 (none), 0 (the concurrency) or up to %d", o.Prefetch, MaxBatchSize))
	}
	if _, err := o.TopologyOptions.Parse(); err != nil {
		errs = append(errs, err)
	}
	if o.MinReplicasAcked < 0 {
		errs = append(errs, errors.New("min_replicas_acked must not be negative"))
	}
	return errors.Join(errs...)
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// RedisOptions parses url into go-redis options in o's mode, adding the
// TLS settings and pool size of o. It is shared with the producer and the
// CLI.
func RedisOptions(url string, o Options) (*redisclient.Options, error) {
	if url == "" {
		return nil, errors.New("no Redis URL: set url, --redis.url, --redis.url-file or REDIS_URL")
	}
	top, err := o.TopologyOptions.Parse()
	if err != nil {
		return nil, err
	}
	ro, err := top.Parse(url)
	if err != nil {
		return nil, err
	}
	var tlsErr error
	ro.Tune(func(c *redisclient.Common) {
		if o.PoolSize > 0 {
			c.PoolSize = o.PoolSize
		}
		c.TLSConfig, tlsErr = o.tls(c.TLSConfig)
	})
	if tlsErr != nil {
		return nil, tlsErr
	}
	return ro, nil
}

// tls returns the TLS configuration of a connection whose URL gave tc (nil
// for redis://), with o's tls_* options or else the deployment's redis_tls.
func (o Options) tls(tc *tls.Config) (*tls.Config, error) {
	if o.TLSCACert == "" && o.TLSCert == "" && !o.TLSInsecureSkipVerify && o.TLSServerName == "" {
		return transport.Env{RedisTLS: o.deploymentTLS}.RedisTLSFor(tc), nil
	}
	if tc == nil {
		return nil, errors.New("tls_* options need a rediss:// URL")
	}
	tc.InsecureSkipVerify = o.TLSInsecureSkipVerify // #nosec G402 -- opt-in, documented as testing only
	if o.TLSServerName != "" {
		tc.ServerName = o.TLSServerName
	}
	if o.TLSCACert != "" {
		pem, err := os.ReadFile(o.TLSCACert)
		if err != nil {
			return nil, fmt.Errorf("tls_ca_cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca_cert %s: no certificate found", o.TLSCACert)
		}
		tc.RootCAs = pool
	}
	if o.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("tls_cert/tls_key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
