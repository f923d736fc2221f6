# fiberd's build. `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
BIN ?= bin
FUZZTIME ?= 10s
# Where hack/kube-tools.sh caches kube-apiserver, kubectl and etcd.
FIBERD_KUBE_CACHE ?= $(HOME)/.cache/fiberd/kube
export FIBERD_KUBE_CACHE

.PHONY: help build test vet fuzz ci kube-tools test-integration clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## Build every command into ./bin.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

test: ## Unit tests with the race detector.
	$(GO) test -race -count=1 ./...

vet: ## go vet and gofmt.
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

fuzz: ## Run every fuzz target for FUZZTIME each.
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

ci: vet build test fuzz ## What .ci/run runs.

.PHONY: demo
demo: ## Start fiberd -dev, clone warm and cold fibers, print their times, stop it.
	hack/demo.sh
