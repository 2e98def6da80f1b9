# natstone developer commands. `make` (or `make help`) lists them; CI runs `make test` via .ci/run.

GO       ?= go
FUZZTIME ?= 10s
ARGS     ?=
BENCH_JSON ?= bench-results/$(shell date -u +%Y-%m-%dT%H%M%SZ).json
# The commit `natstone version` and the bench's JSON name ("" outside a Git checkout).
COMMIT   := $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)

.DEFAULT_GOAL := help
.PHONY: help build run test vet fmt-check lint tools fuzz bench bench-micro tidy-check faults faults-long

help: ## list the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-11s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

build: ## build bin/natstone
	$(GO) build -ldflags "-X main.commit=$(COMMIT)" -o bin/natstone ./cmd/natstone

run: ## run `natstone serve` (extra flags: make run ARGS='--sync always')
	$(GO) run ./cmd/natstone serve $(ARGS)

test: vet fmt-check ## vet, check formatting, run every test with the race detector, then the tests on a cluster without it
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run Cluster -v ./broker ./kv ./test/natstest ./test/faults

vet: ## go vet every package
	$(GO) vet ./...

fmt-check: ## fail, listing them, if files need gofmt
	@out="$$(gofmt -l .)"; \
	if [ -n "$$out" ]; then echo "these files need gofmt:"; echo "$$out"; exit 1; fi

GOLANGCI_LINT ?= $(shell command -v golangci-lint || echo $$($(GO) env GOPATH)/bin/golangci-lint)

lint: vet fmt-check ## vet, check formatting, and golangci-lint (.golangci.yml) when it is installed (make tools)
	@if [ -x "$(GOLANGCI_LINT)" ]; then \
		$(GOLANGCI_LINT) run ./...; \
	else \
		echo "golangci-lint is not installed (make tools): skipped"; \
	fi

tools: ## install golangci-lint from the Go module proxy (takes a few minutes to build)
	$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

KILLS ?= 100

faults: ## the kill/restart fault tests, short (also part of make test)
	$(GO) test -race -count=1 -run '^TestFaults' -v ./test/faults/

faults-long: ## the fault tests with KILLS kills per variant (default 100)
	NATSTONE_FAULT_KILLS=$(KILLS) $(GO) test -count=1 -timeout 90m -run '^TestFaults' -v ./test/faults/

fuzz: ## run every Fuzz* target for FUZZTIME each (default 10s)
	@set -e; \
	for pkg in $$($(GO) list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do \
		names="$$($(GO) test -list '^Fuzz' "$$pkg")"; \
		for name in $$(echo "$$names" | grep '^Fuzz' || true); do \
			echo "== $$pkg $$name"; \
			$(GO) test -run '^$$' -fuzz "^$${name}$$" -fuzztime $(FUZZTIME) "$$pkg"; \
		done; \
	done

bench: build ## natstone bench: baselines and S1–S9 in one run, table on stdout, JSON in bench-results/ (flags: ARGS='--pending 1000000')
	@mkdir -p $(dir $(BENCH_JSON))
	bin/natstone bench --json $(BENCH_JSON) $(ARGS)

bench-micro: ## run the Go micro-benchmarks (index, codecs) with allocations
	$(GO) test -run '^$$' -bench . -benchmem ./...

tidy-check: ## fail if go mod tidy would change go.mod or go.sum
	$(GO) mod tidy -diff
