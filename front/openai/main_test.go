package openai_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind (the
// front's server, its result readers, a call's watcher).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
