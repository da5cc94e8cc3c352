// Package image holds the checks of sluice's container image (the Dockerfile
// and .dockerignore at the repository root). It has no code of its own.
//
// No image is built: the tests read the Dockerfile, build the binary with the
// build stage's own commands (environment, flags and ldflags, parsed from the
// file, so a change there changes what is tested) from a copy of the build
// context that .dockerignore leaves, lay out the final stage's files as its
// COPY instructions do, and check and run what the ENTRYPOINT names: a static,
// stripped binary stamped with the version, reachable as /llm-d-async for
// upstream's Helm chart, running as a non-root user.
package image
