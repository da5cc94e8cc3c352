# The sluice container image.
#
#   make image                                   # docker or podman, whichever is installed
#   docker build --build-arg VERSION=v0.1.0 -t ghcr.io/sluice-io/sluice:v0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=v0.1.0 .
#
# The binary is /sluice (the ENTRYPOINT), and /llm-d-async is a symbolic link to it: upstream's
# Helm chart runs command ["/llm-d-async"] with upstream's flags, and sluice, started with no
# subcommand, is the dispatcher with those flags. So the image runs under upstream's chart
# (only ap.image.* change) as well as under deploy/helm/sluice.
#
# deploy/image's tests read this file: they build the binary with the build stage's own
# commands (environment, flags, ldflags), lay out the final stage's files the way its COPY
# instructions do, and run what the ENTRYPOINT names. Keep the build stage's commands to
# `go mod download`, `go build`, `mkdir -p` and `ln -s` (or teach the test the new one).

# Must match go.mod: the same major.minor, not older than its `go` line (the golang image sets
# GOTOOLCHAIN=local, so an older Go does not build the module).
ARG GO_VERSION=1.26.8

# The build stage runs on the builder's own platform and cross-compiles for the target one
# (no emulation for multi-platform builds: CGO is off, the binary is pure Go).
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
# Set by BuildKit and buildah for the platform being built; empty: the builder's.
ARG TARGETOS
ARG TARGETARCH
# Printed by `sluice version` and logged at start-up. `make image` passes `git describe`; the
# build context holds no .git (see .dockerignore), so there is no way to find it here.
ARG VERSION=dev
ARG COMMIT=
WORKDIR /src

# The module download is its own layer: it is rebuilt only when go.mod or go.sum change. The
# plugin SDK is a module of its own that go.mod replaces with ./plugins/sdk: its go.mod comes too.
COPY go.mod go.sum ./
COPY plugins/sdk/go.mod plugins/sdk/go.sum ./plugins/sdk/
RUN go mod download

COPY . .
# Static (no cgo, no libc), reproducible paths (-trimpath), stripped (-s -w).
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/sluice ./cmd/sluice \
 && ln -s sluice /out/llm-d-async

# distroless/static: CA certificates (TLS to Pub/Sub, rediss://, https gateways, OTLP), tzdata,
# /etc/passwd with the nonroot user (65532), no shell and no package manager. It is the base of
# upstream's image too (gcr.io/distroless/static:nonroot).
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG COMMIT=
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Dispatch agent for LLM batch traffic; a drop-in replacement for the llm-d Async Processor" \
      org.opencontainers.image.source="https://github.com/sluice-io/sluice" \
      org.opencontainers.image.url="https://github.com/sluice-io/sluice" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
# /sluice and the link /llm-d-async -> sluice (COPY of a directory keeps symbolic links), one
# copy of the binary in the image.
COPY --from=build /out/ /
# Numeric, so that the kubelet can check runAsNonRoot (the charts set it).
USER 65532:65532
# health (/healthz, /readyz) and metrics (/metrics): the defaults of --health-port and
# --metrics-port.
EXPOSE 8081 9090
ENTRYPOINT ["/sluice"]
