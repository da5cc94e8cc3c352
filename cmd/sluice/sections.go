package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/redisstate"
	"github.com/sluice-io/sluice/front/filestore/disk"
	gcsstore "github.com/sluice-io/sluice/front/filestore/gcs"
	s3store "github.com/sluice-io/sluice/front/filestore/s3"
	"github.com/sluice-io/sluice/front/openai"
)

// The fronts' sections of a config (batch_api, openai_api) are kept as
// written by core/config, which cannot import the fronts; they are read
// here into the components' own Config types (front/batch, front/openai,
// the file stores), and each component's Validate checks its keys. What
// is checked here is what only the assembly knows: the queues a section
// names, the transport's producer, the listen addresses and the ports.

// frontConfig is the fronts' sections, read.
type frontConfig struct {
	batch  *batchSection  // nil when batch_api is off
	openai *openaiSection // nil when openai_api is off
}

// batchSection is batch_api: the keys the assembly reads (batchKeys),
// front/batch's Config (its keys beside them; Queue the broker name) and
// the file store's.
type batchSection struct {
	batchKeys
	front batch.Config
	files storeSection
}

// batchKeys are the keys of batch_api that `sluice serve` reads itself.
type batchKeys struct {
	// Enabled turns the Batch API on (default off).
	Enabled bool `json:"enabled,omitempty"`
	// Listen is its own address (default 127.0.0.1:8090).
	Listen string `json:"listen,omitempty"`
	// Files is the file store: "store" (disk, s3 or gcs; default disk)
	// and that store's Config keys.
	Files json.RawMessage `json:"files,omitempty"`
	// State is where jobs and their recorded results live.
	State batchState `json:"state"`
}

// batchState is batch_api.state.
type batchState struct {
	// Store is "bolt" (default: a local embedded file, single node) or
	// "redis" (several front replicas): on a Redis transport, the Redis the
	// transport reaches (its url and topology options, else the
	// deployment's redis_url, redis_mode, redis_addrs, redis_master_name and
	// redis_tls); on another transport, the deployment's.
	Store string `json:"store,omitempty"`
	// Path is the bolt file (default sluice-batch.db).
	Path string `json:"path,omitempty"`
	// Prefix starts the redis store's keys (default sluice-batch:; see
	// redisstate.CheckPrefix).
	Prefix string `json:"prefix,omitempty"`
}

// storeSection is batch_api.files: the store chosen and its Config (the
// others stay zero).
type storeSection struct {
	store string
	disk  disk.Config
	s3    s3store.Config
	gcs   gcsstore.Config
}

// openaiSection is openai_api: the key the assembly reads (enabled) beside
// front/openai's Config (DefaultQueue and Queues the broker names).
type openaiSection struct {
	// Enabled turns the front on (default off).
	Enabled bool `json:"enabled,omitempty"`
	openai.Config
}

// problems collects what is wrong with the fronts' sections, each with
// where it is, as config.Validate reports the rest.
type problems struct{ ps config.Problems }

func (p *problems) add(where, format string, a ...any) {
	p.ps = append(p.ps, config.Problem{Where: where, What: fmt.Sprintf(format, a...)})
}

// addErr adds each error err joins (a component's Validate) at where.
func (p *problems) addErr(where string, err error) {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			p.addErr(where, e)
		}
		return
	}
	if err != nil {
		p.add(where, "%s", err.Error())
	}
}

// decodeSection decodes raw into dst, having checked its keys against
// shape (unknown keys reported as config.Parse reports them); it reports
// false when a key is unknown or a value is not of its key's type.
func (p *problems) decodeSection(raw json.RawMessage, where string, shape, dst any) bool {
	ps := config.UnknownKeys(raw, shape, where)
	p.ps = append(p.ps, ps...)
	if err := json.Unmarshal(raw, dst); err != nil {
		p.add(where, "%v", err)
		return false
	}
	return len(ps) == 0
}

// written reports whether a section is there (not absent, not null).
func written(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// readFronts reads and checks the fronts' sections of cfg (defaulted by
// cfg.SetDefaults): each section in its components' types, with their
// defaults, checked by them, and what the assembly checks itself. The
// error lists every problem.
func readFronts(cfg *config.Config, ad app.Adapters) (frontConfig, error) {
	var p problems
	var fc frontConfig
	if written(cfg.BatchAPI) {
		fc.batch = p.readBatch(cfg, ad)
	}
	if written(cfg.OpenAIAPI) {
		fc.openai = p.readOpenAI(cfg, ad)
	}
	if fc.batch != nil && fc.openai != nil {
		_, bp, err1 := net.SplitHostPort(fc.batch.Listen)
		_, op, err2 := net.SplitHostPort(fc.openai.Listen)
		if err1 == nil && err2 == nil && bp == op && bp != "0" {
			p.add("openai_api.listen", "same port as batch_api.listen (%s)", bp)
		}
	}
	if fc.batch != nil || fc.openai != nil {
		if err := ad.Producers.Check(cfg.Transport, cfg.TransportConfig.Options); err != nil {
			p.add("fronts", "%v", err)
		}
	}
	if len(p.ps) > 0 {
		return frontConfig{}, p.ps
	}
	return fc, nil
}

// frontProblems is what `sluice validate` reports of the fronts' sections
// beside the config's own problems (readFronts' error).
func frontProblems(cfg *config.Config, ad app.Adapters) error {
	_, err := readFronts(cfg, ad)
	return err
}

// readBatch reads batch_api; nil when it is off.
func (p *problems) readBatch(cfg *config.Config, ad app.Adapters) *batchSection {
	const w = "batch_api"
	raw := cfg.BatchAPI
	var b batchSection
	shape := struct {
		batchKeys
		batch.Config
	}{}
	if !p.decodeSection(raw, w, shape, &b.batchKeys) || !b.Enabled {
		return nil
	}
	if err := json.Unmarshal(raw, &b.front); err != nil {
		p.add(w, "%v", err)
		return nil
	}
	if b.Listen == "" {
		b.Listen = "127.0.0.1:8090"
	}
	p.listenProblems(cfg, w+".listen", b.Listen)
	p.producerProblems(cfg, ad, w)
	switch q := cfg.FindQueue(b.front.Queue); {
	case q == nil && b.front.Queue == "":
		p.add(w+".queue", "missing: there are %d queues, name the one batches go to", len(cfg.TransportConfig.Queues))
	case q == nil:
		p.add(w+".queue", "%q names no configured queue", b.front.Queue)
	case !q.ResultFromMessage:
		p.add(w+".queue", "queue %s has its own result_queue_name: batch results must be routed by the message (leave it out, set transport_config.result_queue_name instead)", q.ID)
	default:
		b.front.Queue = q.Name
	}
	if b.front.Queue != "" {
		p.addErr(w, b.front.Validate())
	}
	p.stateProblems(cfg, &b.State)
	b.files = p.readFiles(b.Files)
	return &b
}

// stateProblems defaults and checks batch_api.state.
func (p *problems) stateProblems(cfg *config.Config, s *batchState) {
	const w = "batch_api.state"
	if s.Store == "" {
		s.Store = "bolt"
	}
	if s.Path == "" {
		s.Path = "sluice-batch.db"
	}
	switch s.Store {
	case "bolt":
	case "redis":
		if cfg.RedisURL == "" && !transportHasURL(cfg) {
			p.add(w+".store", "redis needs redis_url (--redis.url, $REDIS_URL) or a Redis transport with its own url")
		}
		p.addErr(w+".prefix", redisstate.CheckPrefix(s.Prefix))
	default:
		p.add(w+".store", "%q: want bolt or redis", s.Store)
	}
}

// transportHasURL reports whether the transport options carry a url of
// their own (the Redis transports' "url" option), on which the fronts reach
// the transport's Redis.
func transportHasURL(cfg *config.Config) bool {
	if cfg.Transport != "redis-sortedset" && cfg.Transport != "redis-stream" {
		return false
	}
	var o struct {
		URL string `json:"url"`
	}
	return len(cfg.TransportConfig.Options) > 0 && json.Unmarshal(cfg.TransportConfig.Options, &o) == nil && o.URL != ""
}

// storeKind is a file store: its name in batch_api.files.store and where
// its Config is in a storeSection.
type storeKind struct {
	name string
	cfg  func(*storeSection) any
}

// storeKinds are the file stores, in the order messages list them.
var storeKinds = []storeKind{
	{"disk", func(s *storeSection) any { return &s.disk }},
	{"s3", func(s *storeSection) any { return &s.s3 }},
	{"gcs", func(s *storeSection) any { return &s.gcs }},
}

// readFiles reads batch_api.files into the chosen store's Config, with its
// defaults, and checks it with the store's Validate. A key of another
// store is refused naming the chosen store's keys.
func (p *problems) readFiles(raw json.RawMessage) storeSection {
	const w = "batch_api.files"
	var keys map[string]json.RawMessage
	if written(raw) {
		if err := json.Unmarshal(raw, &keys); err != nil {
			p.add(w, "%v", err)
			return storeSection{}
		}
	}
	s := storeSection{store: "disk"}
	if v, ok := keys["store"]; ok {
		if err := json.Unmarshal(v, &s.store); err != nil {
			p.add(w+".store", "%v", err)
			return storeSection{}
		}
		delete(keys, "store")
	}
	i := slices.IndexFunc(storeKinds, func(k storeKind) bool { return k.name == s.store })
	if i < 0 {
		p.add(w+".store", "%q: want disk, s3 or gcs", s.store)
		return storeSection{}
	}
	dst := storeKinds[i].cfg(&s)
	rest, err := json.Marshal(keys)
	if err != nil {
		p.add(w, "%v", err)
		return storeSection{}
	}
	var anyStore []string
	for _, k := range storeKinds {
		anyStore = append(anyStore, jsonKeys(k.cfg(&storeSection{}))...)
	}
	own := jsonKeys(dst)
	for _, u := range config.UnknownKeys(rest, dst, w) {
		if slices.Contains(anyStore, strings.TrimPrefix(u.Where, w+".")) {
			u.What = fmt.Sprintf("not a setting of the %s store (its keys: %s)", s.store, strings.Join(own, ", "))
		}
		p.ps = append(p.ps, u)
	}
	if err := json.Unmarshal(rest, dst); err != nil {
		p.add(w, "%v", err)
		return storeSection{}
	}
	c := dst.(interface {
		SetDefaults()
		Validate() error
	})
	c.SetDefaults()
	p.addErr(w, c.Validate())
	return s
}

// jsonKeys are the config keys of the struct *v points to, in field order.
func jsonKeys(v any) []string {
	t := reflect.TypeOf(v).Elem()
	var keys []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// readOpenAI reads openai_api; nil when it is off.
func (p *problems) readOpenAI(cfg *config.Config, ad app.Adapters) *openaiSection {
	const w = "openai_api"
	var o openaiSection
	if !p.decodeSection(cfg.OpenAIAPI, w, o, &o) || !o.Enabled {
		return nil
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:8091"
	}
	p.listenProblems(cfg, w+".listen", o.Listen)
	p.producerProblems(cfg, ad, w)
	resolved := true
	resolve := func(where, name string) string {
		q := cfg.FindQueue(name)
		switch {
		case q == nil && name == "":
			p.add(where, "missing: there are %d queues, name the one calls go to", len(cfg.TransportConfig.Queues))
		case q == nil:
			p.add(where, "%q names no configured queue", name)
		case !q.ResultFromMessage:
			p.add(where, "queue %s has its own result_queue_name: each call's result must be routed by the message (leave it out, set transport_config.result_queue_name instead)", q.ID)
		default:
			return q.Name
		}
		resolved = false
		return name
	}
	o.DefaultQueue = resolve(w+".default_queue", o.DefaultQueue)
	for i, n := range o.Queues {
		o.Queues[i] = resolve(fmt.Sprintf("%s.queues[%d]", w, i), n)
	}
	if resolved {
		o.SetDefaults()
		if err := o.Validate(); err != nil {
			p.add(w, "%s", strings.TrimPrefix(err.Error(), w+": "))
		}
	}
	return &o
}

// listenProblems checks a front's listen address: host:port, and not the
// metrics or the health port.
func (p *problems) listenProblems(cfg *config.Config, where, listen string) {
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		p.add(where, "%q is not host:port: %v", listen, err)
		return
	}
	for _, o := range []struct {
		name string
		port int
	}{{"metrics_port", cfg.MetricsPort}, {"health_port", cfg.HealthPort}} {
		if o.port > 0 && port == strconv.Itoa(o.port) {
			p.add(where, "same port as %s (%d)", o.name, o.port)
		}
	}
}

// producerProblems reports a front (where) on a transport without a
// producer side: the fronts need one, with per-request result routes.
func (p *problems) producerProblems(cfg *config.Config, ad app.Adapters, where string) {
	if !ad.Producers.Has(cfg.Transport) {
		p.add(where, "needs a transport with a producer and per-request result routes (%s), not %s",
			strings.Join(ad.Producers.Names(), ", "), cfg.Transport)
	}
}
