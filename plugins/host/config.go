package host

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-io/sluice/core/gate"
)

// The gate_params the host consumes; every other parameter is forwarded to
// the plugin's Configure.
const (
	// ParamPath names the plugin binary (required).
	ParamPath = "path"
	// ParamArgs are the binary's arguments: a JSON array, or words separated by spaces.
	ParamArgs = "args"
	// ParamAdmit is "true" to ask the plugin's Admit once per request.
	ParamAdmit = "admit"
	// ParamStartTimeout bounds the plugin's start-up handshake.
	ParamStartTimeout = "start_timeout"
	// ParamRestartBackoff is the first wait before restarting a plugin that died.
	ParamRestartBackoff = "restart_backoff"
	// ParamRestartBackoffMax caps the restart wait, which doubles per failure.
	ParamRestartBackoffMax = "restart_backoff_max"
	// ParamSHA256 pins the binary: the hex SHA-256 digest it must have.
	ParamSHA256 = "sha256"
	// ParamEnv is the plugin's environment: NAME=VALUE, or NAME to pass
	// sluice's own value through (a JSON array, or words separated by spaces).
	ParamEnv = "env"
	// ParamLogRate caps the plugin's stderr lines relayed per second.
	ParamLogRate = "log_rate"
)

// Config says which binary to run and how to supervise it.
type Config struct {
	// Path is the plugin binary.
	Path string
	// Args are its arguments.
	Args []string
	// Admit makes the gate an Admitter that asks the plugin per request.
	Admit bool
	// Params are forwarded to the plugin's Configure.
	Params map[string]string
	// StartTimeout bounds the start-up handshake (default 10s).
	StartTimeout time.Duration
	// RestartBackoff is the first wait before a restart (default 500ms).
	RestartBackoff time.Duration
	// RestartBackoffMax caps the wait, which doubles per consecutive failure (default 30s).
	RestartBackoffMax time.Duration
	// SHA256, when set, is the hex SHA-256 digest the binary must have; it
	// is checked before every start, restarts included.
	SHA256 string
	// Env is the plugin's whole environment (go-plugin adds its handshake
	// variables): each entry NAME=VALUE, or NAME to pass sluice's own value
	// of NAME through (left out when sluice has none). Empty: an empty
	// environment.
	Env []string
	// LogRate is the most stderr lines of the plugin relayed per second
	// (default 50); the lines beyond it are counted and reported.
	LogRate int
}

func (c *Config) setDefaults() {
	if c.StartTimeout == 0 {
		c.StartTimeout = 10 * time.Second
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = 500 * time.Millisecond
	}
	if c.RestartBackoffMax == 0 {
		c.RestartBackoffMax = 30 * time.Second
	}
	if c.LogRate == 0 {
		c.LogRate = 50
	}
	c.SHA256 = strings.ToLower(strings.TrimSpace(c.SHA256))
}

// Validate reports a missing path or a non-positive duration. It does no I/O:
// whether the binary exists is found out when the plugin first starts.
func (c *Config) Validate() error {
	if strings.TrimSpace(c.Path) == "" {
		return fmt.Errorf("gate_params.%s is required (the plugin binary)", ParamPath)
	}
	for name, d := range map[string]time.Duration{
		ParamStartTimeout: c.StartTimeout, ParamRestartBackoff: c.RestartBackoff, ParamRestartBackoffMax: c.RestartBackoffMax,
	} {
		if d < 0 {
			return fmt.Errorf("gate_params.%s: %v is negative", name, d)
		}
	}
	if c.RestartBackoffMax < c.RestartBackoff {
		return fmt.Errorf("gate_params.%s %v is below %s %v", ParamRestartBackoffMax, c.RestartBackoffMax, ParamRestartBackoff, c.RestartBackoff)
	}
	if c.SHA256 != "" {
		if b, err := hex.DecodeString(c.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("gate_params.%s: %q is not a SHA-256 digest (64 hex digits, as sha256sum prints)", ParamSHA256, c.SHA256)
		}
	}
	for _, e := range c.Env {
		name, _, _ := strings.Cut(e, "=")
		if name == "" || strings.ContainsAny(name, " \t\n\x00") {
			return fmt.Errorf("gate_params.%s: %q is not NAME or NAME=VALUE", ParamEnv, e)
		}
	}
	if c.LogRate < 0 {
		return fmt.Errorf("gate_params.%s: %d is negative", ParamLogRate, c.LogRate)
	}
	return nil
}

// environ is the plugin's environment: Env, with the bare names resolved
// against lookup (sluice's own environment).
func (c *Config) environ(lookup func(string) (string, bool)) []string {
	out := make([]string, 0, len(c.Env))
	for _, e := range c.Env {
		if strings.Contains(e, "=") {
			out = append(out, e)
		} else if v, ok := lookup(e); ok {
			out = append(out, e+"="+v)
		}
	}
	return out
}

// ConfigFromParams reads the host's own parameters and collects the rest for
// the plugin. failure_policy and refresh_interval are handled by the gate
// registry and are not forwarded.
func ConfigFromParams(p gate.Params) (Config, error) {
	var c Config
	var err error
	c.Path = p.String(ParamPath, "")
	if c.Args, err = parseList(p, ParamArgs); err != nil {
		return Config{}, err
	}
	if c.Env, err = parseList(p, ParamEnv); err != nil {
		return Config{}, err
	}
	c.SHA256 = p.String(ParamSHA256, "")
	if c.LogRate, err = p.Int(ParamLogRate, 0); err != nil {
		return Config{}, err
	}
	switch a := strings.ToLower(strings.TrimSpace(p.String(ParamAdmit, "false"))); a {
	case "true", "1", "yes":
		c.Admit = true
	case "false", "0", "no", "":
	default:
		return Config{}, fmt.Errorf("gate_params.%s: %q is not true or false", ParamAdmit, a)
	}
	if c.StartTimeout, err = p.Duration(ParamStartTimeout, 0); err != nil {
		return Config{}, err
	}
	if c.RestartBackoff, err = p.Duration(ParamRestartBackoff, 0); err != nil {
		return Config{}, err
	}
	if c.RestartBackoffMax, err = p.Duration(ParamRestartBackoffMax, 0); err != nil {
		return Config{}, err
	}
	own := map[string]bool{
		ParamPath: true, ParamArgs: true, ParamAdmit: true, ParamStartTimeout: true,
		ParamRestartBackoff: true, ParamRestartBackoffMax: true, ParamSHA256: true, ParamEnv: true, ParamLogRate: true,
		gate.ParamFailurePolicy: true, gate.ParamRefreshInterval: true,
	}
	c.Params = map[string]string{}
	for _, k := range p.Keys() {
		if own[k] {
			continue
		}
		if raw := p.Raw(k); raw != nil {
			c.Params[k] = string(raw)
			continue
		}
		c.Params[k] = p.String(k, "")
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// parseList reads a list parameter: a JSON array of strings, or words
// separated by spaces.
func parseList(p gate.Params, key string) ([]string, error) {
	raw := p.Raw(key)
	if raw == nil {
		s := strings.TrimSpace(p.String(key, ""))
		if !strings.HasPrefix(s, "[") {
			return strings.Fields(s), nil
		}
		raw = json.RawMessage(s)
	}
	var args []string
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, fmt.Errorf("gate_params.%s: want a JSON array of strings or words separated by spaces: %w", key, err)
	}
	return args, nil
}
