package transport

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: the
// claim loop starts one per queue and must stop them all on Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
