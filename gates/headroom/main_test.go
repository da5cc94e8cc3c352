package headroom_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// reading scrapes every pod on a goroutine of its own, and each must be
// done by the time the reading returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
