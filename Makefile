# Build, test and run targets. `make help` lists them.

GO          ?= go
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT      ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
PKG         := github.com/throttlehq/throttle
LDFLAGS     := -s -w -X $(PKG)/internal/cli.version=$(VERSION) -X $(PKG)/internal/cli.commit=$(COMMIT)
BIN         ?= bin/throttle
IMAGE       ?= throttle:$(VERSION)
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK ?= $(shell command -v staticcheck 2>/dev/null || echo $$($(GO) env GOPATH)/bin/staticcheck)
COMPOSE     ?= docker compose

.PHONY: help build image test test-race bench lint alerts tools up down

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## Build bin/throttle, static, with the version and commit stamped in.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/throttle

image: ## Build the Docker image throttle:VERSION.
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE) .

test: ## Run every test (services that are missing are skipped, or fail with CI=true).
	$(GO) test ./...

test-race: ## Run every test with the race detector.
	$(GO) test -race ./...

bench: ## Run the limiter benchmarks and the benchmark program.
	$(GO) test -run '^$$' -bench . -benchmem ./limiter/...
	cd integration/bench && $(GO) run .

lint: ## Run go vet and staticcheck (`make tools` installs staticcheck).
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd integration/bench && $(GO) vet ./... && $(STATICCHECK) ./...

alerts: ## Check and unit-test examples/prometheus/alerts.yml (needs promtool).
	cd examples/prometheus && promtool check rules alerts.yml && promtool test rules alerts_test.yml

tools: ## Install staticcheck from the Go module proxy.
	$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

up: ## Start the full stack (docker-compose.yml) in the background.
	VERSION=$(VERSION) COMMIT=$(COMMIT) $(COMPOSE) up -d --build

down: ## Stop the full stack and delete its volumes.
	$(COMPOSE) down -v
