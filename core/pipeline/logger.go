package pipeline

import (
	"context"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// routerLogger adapts slog for Watermill's router. The router logs at trace
// level twice per message; this adapter drops trace entirely and checks the
// level before building attributes, so the per-message path allocates
// nothing for logs. Watermill's Info lines (handler start/stop) go to debug,
// its errors stay errors (sluice logs the request-level story itself).
type routerLogger struct {
	log    *slog.Logger
	fields watermill.LogFields
}

func newRouterLogger(log *slog.Logger) watermill.LoggerAdapter { return routerLogger{log: log} }

func (l routerLogger) emit(level slog.Level, msg string, err error, fields watermill.LogFields) {
	ctx := context.Background()
	if !l.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, len(l.fields)+len(fields)+1)
	for k, v := range l.fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	for k, v := range fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	if err != nil {
		attrs = append(attrs, slog.Any("err", err))
	}
	l.log.LogAttrs(ctx, level, "watermill: "+msg, attrs...)
}

// Error logs at error level.
func (l routerLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.emit(slog.LevelError, msg, err, fields)
}

// Info logs at debug level.
func (l routerLogger) Info(msg string, fields watermill.LogFields) {
	l.emit(slog.LevelDebug, msg, nil, fields)
}

// Debug logs at debug level.
func (l routerLogger) Debug(msg string, fields watermill.LogFields) {
	l.emit(slog.LevelDebug, msg, nil, fields)
}

// Trace is dropped.
func (routerLogger) Trace(string, watermill.LogFields) {}

// With returns a logger with extra fields.
func (l routerLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return routerLogger{log: l.log, fields: l.fields.Add(fields)}
}
