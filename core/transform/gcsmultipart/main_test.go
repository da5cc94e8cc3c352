package gcsmultipart_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The end-to-end test starts servers and dispatch clients: none may outlive it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
