// Package redisstate is the Batch API's state store (front/batch.State) in
// Redis, for deployments on the Redis transports with several front
// replicas: jobs and file records are JSON values, each job's records a
// hash written with HSETNX (a line recorded once, however often it is
// recorded) and its counts a hash changed in the same script, ownership a
// key with a TTL set only by its owner or when it is free.
//
// Redis Cluster: every key of one job carries the job id as hash tag
// (<prefix>{<job id>}:job, :rec, :counts, :owner), so each script and
// transaction on one job touches one hash slot. Listing goes through index
// keys (<prefix>jobs and <prefix>files, sorted sets; <prefix>active, a set),
// each one key and so one slot: SCAN per master would need every master,
// walks the whole keyspace and gives no order for paging, where a sorted
// set pages by id directly. An index is written next to, not in the same
// transaction as, the record it points to: a reader skips an id whose
// record is gone. The prefix must not contain '{' or '}'.
package redisstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// Store is a Redis-backed batch.State.
type Store struct {
	c      redis.UniversalClient
	prefix string
	own    bool
}

var _ batch.State = (*Store)(nil)

// New returns a store on client under key prefix (default
// "sluice-batch:"); Close leaves the client open.
func New(client redis.UniversalClient, prefix string) *Store {
	if prefix == "" {
		prefix = "sluice-batch:"
	}
	return &Store{c: client, prefix: prefix}
}

// Dial connects to the Redis URL in the deployment's topology (env's
// RedisMode, RedisAddrs and RedisMasterName, read by redisclient as the
// Redis transports read them: single, cluster or sentinel); Close closes
// the connection. A rediss:// URL takes its TLS from env.RedisTLS (the
// deployment's redis_tls) when set, as the Redis transports do
// (transport.Env.RedisTLSFor).
func Dial(url, prefix string, env transport.Env) (*Store, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	top, err := redisclient.ParseTopology(env.RedisMode, env.RedisAddrs, env.RedisMasterName)
	if err != nil {
		return nil, fmt.Errorf("batch state: redis_mode, redis_addrs, redis_master_name: %w", err)
	}
	o, err := top.Parse(url)
	if err != nil {
		return nil, fmt.Errorf("batch state: %w", err)
	}
	o.Tune(func(c *redisclient.Common) { c.TLSConfig = env.RedisTLSFor(c.TLSConfig) })
	s := New(o.New(), prefix)
	s.own = true
	return s, nil
}

// NewChecked is New with the prefix checked as Dial checks it: a store on
// a connection someone else owns (the transport's), which Close leaves
// open.
func NewChecked(client redis.UniversalClient, prefix string) (*Store, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	return New(client, prefix), nil
}

// CheckPrefix reports a key prefix the store refuses: one with '{' or
// '}' (each job's keys take its id as their hash tag, for Redis Cluster).
func CheckPrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("batch state: prefix %q: must not contain '{' or '}' (the job id is the keys' hash tag)", prefix)
	}
	return nil
}

// Close implements batch.State.
func (s *Store) Close() error {
	if s.own {
		return s.c.Close()
	}
	return nil
}

func (s *Store) k(parts ...string) string {
	k := s.prefix
	for i, p := range parts {
		if i > 0 {
			k += ":"
		}
		k += p
	}
	return k
}

// jk is the key of kind for job id, tagged by the id so that all keys of
// one job share a hash slot.
func (s *Store) jk(kind, id string) string {
	return s.prefix + "{" + id + "}:" + kind
}

func (s *Store) getJSON(ctx context.Context, key, what, id string, v any) error {
	b, err := s.c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("%s %s: %w", what, id, batch.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	return json.Unmarshal(b, v)
}

// PutFile implements batch.State.
func (s *Store) PutFile(ctx context.Context, f batch.File) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	_, err = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, s.k("file", f.ID), b, 0)
		p.ZAdd(ctx, s.k("files"), redis.Z{Member: f.ID})
		return nil
	})
	return err
}

// GetFile implements batch.State.
func (s *Store) GetFile(ctx context.Context, id string) (batch.File, error) {
	var f batch.File
	return f, s.getJSON(ctx, s.k("file", id), "file", id, &f)
}

// DeleteFile implements batch.State.
func (s *Store) DeleteFile(ctx context.Context, id string) error {
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, s.k("file", id))
		p.ZRem(ctx, s.k("files"), id)
		return nil
	})
	return err
}

// ids lists an index newest first (ids sort by creation) after after.
func (s *Store) ids(ctx context.Context, index, after string, limit int) ([]string, bool, error) {
	max := "+"
	if after != "" {
		max = "(" + after
	}
	ids, err := s.c.ZRevRangeByLex(ctx, index, &redis.ZRangeBy{Max: max, Min: "-", Count: int64(limit + 1)}).Result()
	if err != nil {
		return nil, false, err
	}
	more := len(ids) > limit
	if more {
		ids = ids[:limit]
	}
	return ids, more, nil
}

// ListFiles implements batch.State.
func (s *Store) ListFiles(ctx context.Context, after string, limit int) ([]batch.File, bool, error) {
	ids, more, err := s.ids(ctx, s.k("files"), after, limit)
	if err != nil {
		return nil, false, err
	}
	out := make([]batch.File, 0, len(ids))
	for _, id := range ids {
		f, err := s.GetFile(ctx, id)
		if errors.Is(err, batch.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, false, err
		}
		out = append(out, f)
	}
	return out, more, nil
}

// CreateJob implements batch.State.
func (s *Store) CreateJob(ctx context.Context, j batch.Job) error {
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	ok, err := s.c.SetNX(ctx, s.jk("job", j.ID), b, 0).Result()
	if err != nil {
		return fmt.Errorf("create job %s: %w", j.ID, err)
	}
	if !ok {
		return fmt.Errorf("job %s exists", j.ID)
	}
	_, err = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, s.k("jobs"), redis.Z{Member: j.ID})
		if !batch.Final(j.Status) {
			p.SAdd(ctx, s.k("active"), j.ID)
		}
		return nil
	})
	return err
}

// counts reads job id's recorded counts.
func (s *Store) counts(ctx context.Context, c redis.Cmdable, id string) (completed, failed int64, err error) {
	v, err := c.HMGet(ctx, s.jk("counts", id), "completed", "failed").Result()
	if err != nil {
		return 0, 0, err
	}
	n := func(x any) int64 {
		if str, ok := x.(string); ok {
			i, _ := strconv.ParseInt(str, 10, 64)
			return i
		}
		return 0
	}
	return n(v[0]), n(v[1]), nil
}

// GetJob implements batch.State.
func (s *Store) GetJob(ctx context.Context, id string) (batch.Job, error) {
	var j batch.Job
	if err := s.getJSON(ctx, s.jk("job", id), "job", id, &j); err != nil {
		return j, err
	}
	var err error
	j.Counts.Completed, j.Counts.Failed, err = s.counts(ctx, s.c, id)
	return j, err
}

// UpdateJob implements batch.State: an optimistic transaction on the
// job's key (WATCH), retried when another writer got there first.
func (s *Store) UpdateJob(ctx context.Context, id string, fn func(*batch.Job) error) (batch.Job, error) {
	key := s.jk("job", id)
	var j batch.Job
	for attempt := 0; ; attempt++ {
		err := s.c.Watch(ctx, func(tx *redis.Tx) error {
			j = batch.Job{}
			b, err := tx.Get(ctx, key).Bytes()
			if errors.Is(err, redis.Nil) {
				return fmt.Errorf("job %s: %w", id, batch.ErrNotFound)
			}
			if err != nil {
				return err
			}
			if err := json.Unmarshal(b, &j); err != nil {
				return err
			}
			if err := fn(&j); err != nil {
				return err
			}
			if j.Counts.Completed, j.Counts.Failed, err = s.counts(ctx, tx, id); err != nil {
				return err
			}
			nb, err := json.Marshal(j)
			if err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, key, nb, 0)
				return nil
			})
			return err
		}, key)
		if errors.Is(err, redis.TxFailedErr) && attempt < 50 {
			continue
		}
		if err == nil && batch.Final(j.Status) {
			// The active index is another slot on a cluster: it is
			// updated after the job's own transaction.
			if err = s.c.SRem(ctx, s.k("active"), id).Err(); err != nil {
				err = fmt.Errorf("job %s: drop from active index: %w", id, err)
			}
		}
		return j, err
	}
}

// ListJobs implements batch.State.
func (s *Store) ListJobs(ctx context.Context, after string, limit int) ([]batch.Job, bool, error) {
	ids, more, err := s.ids(ctx, s.k("jobs"), after, limit)
	if err != nil {
		return nil, false, err
	}
	out := make([]batch.Job, 0, len(ids))
	for _, id := range ids {
		j, err := s.GetJob(ctx, id)
		if errors.Is(err, batch.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		out = append(out, j)
	}
	return out, more, nil
}

// ActiveJobs implements batch.State.
func (s *Store) ActiveJobs(ctx context.Context) ([]string, error) {
	return s.c.SMembers(ctx, s.k("active")).Result()
}

// recordScript records lines with HSETNX and counts the new ones, in one
// step: KEYS job, records, counts; ARGV index, ok, line, ...
var recordScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOJOB') end
for i = 1, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i+2]) == 1 then
    if ARGV[i+1] == '1' then redis.call('HINCRBY', KEYS[3], 'completed', 1)
    else redis.call('HINCRBY', KEYS[3], 'failed', 1) end
  end
end
return redis.call('HMGET', KEYS[3], 'completed', 'failed')`)

// Record implements batch.State. A record is stored as "<ok><line>".
func (s *Store) Record(ctx context.Context, id string, recs []batch.Record) (batch.Counts, error) {
	args := make([]any, 0, 3*len(recs))
	for _, r := range recs {
		ok := "0"
		if r.OK {
			ok = "1"
		}
		args = append(args, r.Index, ok, ok+string(r.Line))
	}
	err := recordScript.Run(ctx, s.c, []string{s.jk("job", id), s.jk("rec", id), s.jk("counts", id)}, args...).Err()
	if err != nil && strings.Contains(err.Error(), "NOJOB") {
		return batch.Counts{}, fmt.Errorf("job %s: %w", id, batch.ErrNotFound)
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return batch.Counts{}, fmt.Errorf("record results of %s: %w", id, err)
	}
	j, err := s.GetJob(ctx, id)
	return j.Counts, err
}

// Records implements batch.State.
func (s *Store) Records(ctx context.Context, id string, fn func(batch.Record) error) error {
	m, err := s.c.HGetAll(ctx, s.jk("rec", id)).Result()
	if err != nil {
		return fmt.Errorf("records of %s: %w", id, err)
	}
	recs := make([]batch.Record, 0, len(m))
	for k, v := range m {
		i, err := strconv.Atoi(k)
		if err != nil || v == "" {
			continue
		}
		recs = append(recs, batch.Record{Index: i, OK: v[0] == '1', Line: []byte(v[1:])})
	}
	slices.SortFunc(recs, func(a, b batch.Record) int { return a.Index - b.Index })
	for _, r := range recs {
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// DeleteJob implements batch.State.
func (s *Store) DeleteJob(ctx context.Context, id string) error {
	// One DEL for the job's own keys (one slot); the indexes, other
	// slots on a cluster, each in its own command.
	if err := s.c.Del(ctx, s.jk("job", id), s.jk("rec", id), s.jk("counts", id), s.jk("owner", id)).Err(); err != nil {
		return fmt.Errorf("delete job %s: %w", id, err)
	}
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.k("jobs"), id)
		p.SRem(ctx, s.k("active"), id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete job %s: indexes: %w", id, err)
	}
	return nil
}

var ownScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0`)

var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// Own implements batch.State.
func (s *Store) Own(ctx context.Context, id, owner string, ttl time.Duration) (bool, error) {
	n, err := ownScript.Run(ctx, s.c, []string{s.jk("owner", id)}, owner, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("own %s: %w", id, err)
	}
	return n == 1, nil
}

// Release implements batch.State.
func (s *Store) Release(ctx context.Context, id, owner string) error {
	return releaseScript.Run(ctx, s.c, []string{s.jk("owner", id)}, owner).Err()
}
