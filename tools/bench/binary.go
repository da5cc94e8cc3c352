package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// binaryTargets: the release binary's size.
func binaryTargets() []target {
	return []target{maximum("binary_mb", 40, "the release binary (make build's flags), in MiB")}
}

// releaseLDFlags are the linker flags of `make build` and the Dockerfile,
// without the version stamp (its length does not change the size).
const releaseLDFlags = "-s -w -X main.version=bench -X main.commit=bench"

// runBinary builds cmd/sluice as `make build` does (CGO_ENABLED=0,
// -trimpath, stripped, version stamped) into a temporary directory and
// reports its size in MiB (binary_mb). It runs once whatever -runs says: the
// size does not vary, and the build cache makes a second build cost nothing
// but time.
func runBinary(ctx context.Context, _ options) (figures, error) {
	dir, err := os.MkdirTemp("", "sluice-bench-binary-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "sluice")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", releaseLDFlags, "-o", out, "./cmd/sluice")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w: %s", err, strings.TrimSpace(string(b)))
	}
	st, err := os.Stat(out)
	if err != nil {
		return nil, err
	}
	return figures{"binary_mb": float64(st.Size()) / (1 << 20)}, nil
}
