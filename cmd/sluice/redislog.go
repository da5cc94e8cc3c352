package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/redact"
)

// redisLog carries go-redis's own log lines (connection-pool and failover
// notices, which name addresses and can carry a URL or a dial error) into
// sluice's logger, through its redaction, instead of go-redis's default
// logger writing them to stderr as they are.
type redisLog struct{ log *slog.Logger }

// Printf implements go-redis's logging interface: one warning per line.
func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.log.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)), "component", "go-redis")
}

// setRedisLogger routes go-redis's log lines through log (nil: the default
// logger, text on stderr at info), with secrets masked (core/redact).
// go-redis's logger is process-wide: only the binary sets it.
func setRedisLogger(log *slog.Logger) {
	if log == nil {
		log = app.NewLogger(config.Log{}, os.Stderr)
	}
	redis.SetLogger(redisLog{log: slog.New(redact.NewHandler(log.Handler()))})
}
