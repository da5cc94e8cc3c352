# sluice — the two set-up commands are `make run` and `make test`.
GO      ?= go
PKGS    := ./...
BENCHTIME ?= 1x

.PHONY: run test test-short bench lint fmt vet build fuzz proto

## run: the embedded demo (a batch through the pool-headroom gate, with evict and resume, beside
## interactive bursts on the simulated pool, internal/poolsim, at vLLM's defaults on an H100: the gate
## dispatches to the pods, per pod), then one small OpenAI batch through the embedded Batch
## API (sluice batch demo: prints where its output is); no server needed
run:
	$(GO) run ./cmd/sluice demo --preset vllm-8b-h100
	$(GO) run ./cmd/sluice batch demo

## test: every test, with the race detector (needs redis-server, prometheus and the
## Pub/Sub emulator; .ci/run installs them)
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 15m $(PKGS)
	$(GO) test -count=1 -run 'TestPresetLoadShare' ./internal/poolsim
	cd plugins/sdk && $(GO) vet ./... && $(GO) test -race -count=1 ./...
	cd examples/gate-plugin && $(GO) vet ./... && $(GO) build -o /dev/null .

## test-short: unit tests only
test-short:
	$(GO) test -short -count=1 $(PKGS)

## bench: one BENCH line per scenario, a MISS line per figure that misses its target; fails on any
## miss or failed scenario (go run ./tools/bench -no-fail lists the misses without failing); needs
## what test needs, and valgrind (redis-instructions). interactive-protection and interactive-frontier
## run on the three pool presets: about 4.5 hours of the whole on 2 cores (docs/benchmarks.md, "The
## pools and the bar"); SLUICE_BENCH_IP_PRESETS=stress runs one pool
bench:
	$(GO) run ./tools/bench -timeout 8h

## chaos: every fault the harness can cause (kill -9, Redis and emulator restarts, a faulty
## gateway, fuzzed messages, plugin kills, Prometheus gone, SIGTERM), one CHAOS line each, after
## the self-check (planted faults, counted exactly); exits non-zero on any loss, wrong code or
## failed self-check (docs/chaos.md). Not part of `make test`; about 11 minutes.
.PHONY: chaos
chaos:
	$(GO) run ./tools/chaos

## verify: the model-based state-machine tests run long (docs/verification.md): rapid draws
## VERIFY_CHECKS interleavings per model (make test runs a dozen) against real servers.
## The packages run side by side (-p 5): their tests wait on their own servers (a Redis Cluster
## node takes 2 s to accept writes after a restart) far more than they use the CPU.
VERIFY_CHECKS ?= 1500
MODEL_PKGS    ?= ./transports/redissortedset/ ./transports/redisstream/
MODEL_PKGS    += ./gates/redisquota/ ./core/pipeline/ ./core/transport/
.PHONY: verify
verify:
	$(GO) test -count=1 -p 5 -timeout 120m -run '^TestModel' $(MODEL_PKGS) -args -rapid.checks=$(VERIFY_CHECKS)

## mutants: the mutation test (docs/verification.md): builds the model tests with the
## sluice_mutants tag, plants each bug of internal/mutant's catalog in turn and expects the tests
## to fail; one MUTANT line each (caught/survived/unreached), non-zero exit unless all are caught.
## Not part of `make test`.
.PHONY: mutants
mutants:
	$(GO) run ./tools/mutants

## build: the release binary bin/sluice, as the image builds it: static (CGO_ENABLED=0),
## reproducible paths (-trimpath), stripped (-s -w), VERSION and COMMIT stamped (`sluice version`)
BUILD_FLAGS = -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)"
build:
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/sluice ./cmd/sluice

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

vet:
	$(GO) vet $(PKGS)

lint: vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || (gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'); exit 1)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

## fuzz: run the decoder fuzzer and the hostile-gateway fuzzer of the h2c client for a minute each
## (FUZZTIME=10m for longer)
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./core/wire
	$(GO) test -run '^$$' -fuzz FuzzHostileGateway -fuzztime $(FUZZTIME) ./core/dispatch/h2c

## proto: regenerate plugins/sdk/gatepb/*.pb.go from gate.proto (needs protoc, e.g. Debian
## protobuf-compiler, and the two generators at the versions the committed code was made with)
proto:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc -I plugins/sdk/gatepb \
		--go_out=plugins/sdk/gatepb --go_opt=paths=source_relative \
		--go-grpc_out=plugins/sdk/gatepb --go-grpc_opt=paths=source_relative \
		plugins/sdk/gatepb/gate.proto

## image: the container image (Dockerfile), built with docker or podman, whichever is
## installed (CONTAINER_TOOL=... to choose). IMAGE names it; VERSION is stamped into the
## binary (`sluice version`) and the image's labels; PLATFORM=linux/arm64 builds for another
## platform (cross-compiled, no emulation).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null)
IMAGE   ?= ghcr.io/sluice-io/sluice:$(VERSION)
PLATFORM ?=
CONTAINER_TOOL ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)
.PHONY: image
image:
	@if [ -z "$(CONTAINER_TOOL)" ]; then \
		echo "make image: neither docker nor podman is installed (looked for both in PATH); install one, or set CONTAINER_TOOL" >&2; \
		exit 1; \
	fi; \
	case "$$(basename "$(CONTAINER_TOOL)")" in docker*) \
		"$(CONTAINER_TOOL)" buildx version >/dev/null 2>&1 || { \
			echo "make image: $(CONTAINER_TOOL) has no buildx plugin, and the Dockerfile needs BuildKit (RUN --mount, \$$BUILDPLATFORM): install docker-buildx-plugin, or use podman (CONTAINER_TOOL=podman)" >&2; \
			exit 1; };; \
	esac
	$(CONTAINER_TOOL) build $(if $(PLATFORM),--platform $(PLATFORM)) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE) .
