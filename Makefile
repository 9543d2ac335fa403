# The commands of this repository. `make test` is what CI runs (.ci/run); `make demo` runs the whole
# system locally (`make demo-node`: its real-node option). Both build what they need on a fresh machine, once.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

.PHONY: help test demo demo-node bench control-plane nginx tinyproxy postgres toxiproxy fmt lint unit crds proto book mdbook book-reference

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

control-plane: ## Build etcd, kube-apiserver, controller manager, scheduler, kubectl (and 1.29, 1.22), kubelet, kube-proxy, metrics-server, KWOK and Helm (cached)
	@e2e/control-plane/build.sh

nginx: ## Unpack nginx from Debian's packages for the gRPC proxy tests (cached, no system-wide install)
	@e2e/nginx/install.sh

tinyproxy: ## Unpack tinyproxy from Debian's packages for the egress proxy tests (cached, no system-wide install)
	@e2e/tinyproxy/install.sh

postgres: ## Unpack the PostgreSQL 15 server from Debian's packages for the hub's PostgreSQL tests (cached, no system-wide install)
	@e2e/postgres/install.sh

.PHONY: node
node: ## Install containerd, runc, the CNI plugins and iptables from Debian's packages and build the pause image, for the real-node tests (needs root; without it, says so and does nothing)
	@e2e/node/install.sh

.PHONY: lua
lua: ## Unpack Lua 5.1 from Debian's packages for the Argo CD health check tests (cached, no system-wide install)
	@e2e/lua/install.sh

mdbook: ## Install mdBook from crates.io for the user guide (pinned in docs/tools/mdbook-version; cached, about 5 min cold)
	@docs/tools/install-mdbook.sh

book: mdbook ## Build the user guide into docs/book (open docs/book/index.html; e2e/tests/book.rs checks its links)
	$$(docs/tools/install-mdbook.sh --print-bin) build docs

book-reference: ## Regenerate the guide's generated pages: the command-line reference (from the binaries' --help), the error messages (from the code's `// troubleshooting:` markers) and the Armory keys table (from the agent's ARMORY_KEYS)
	SCALE_AGENT_WRITE_BOOK_REFERENCE=1 $(CARGO) test --locked -p scale-agent-e2e --test book -- the_command_line_reference the_messages_page the_armory_keys_table

test: control-plane nginx tinyproxy lua postgres node mdbook ## Formatting, lints, and every test including the end-to-end ones
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) test --workspace --locked --no-fail-fast
	@# The operator and the agent again on the older API server (e2e/control-plane/older-kubernetes-version).
	SCALE_AGENT_E2E_OLDER_API_SERVER=1 $(CARGO) test --locked -p scale-agent-e2e --test operator --test rbac_operations -- \
		full_flow_agent_process every_documented_operation

ROUNDS ?= 20
.PHONY: chaos
chaos: control-plane postgres ## Long chaos runs on hub replicas on PostgreSQL: make chaos ROUNDS=100 (a random seed, printed; SCALE_AGENT_CHAOS_SEED=<seed> replays one)
	ROUNDS=$(ROUNDS) SCALE_AGENT_CHAOS_SEED=$${SCALE_AGENT_CHAOS_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')} \
		$(CARGO) test --locked -p scale-agent-e2e --test chaos -- --nocapture

demo: control-plane ## Run Scale Agent locally on a real control plane (Ctrl-C stops it)
	@# The demo starts the hub, operator and agent binaries built beside it.
	$(CARGO) build --locked -p scale-agent-e2e --bins
	$(CARGO) run --locked -p scale-agent-e2e --bin scale-agent-demo

demo-node: control-plane node ## The demo's real-node option (root): a one-node cluster with a real kubelet and this build's images, to follow the guide's "On a real cluster" page on (Ctrl-C stops it)
	$(CARGO) build --locked -p scale-agent-e2e --bins
	$(CARGO) run --locked -p scale-agent-e2e --bin scale-agent-demo -- --real-node

toxiproxy: ## Build Toxiproxy, the latency proxy of the benchmark's far rows (cached; not needed by `make test`)
	@bench/toxiproxy/build.sh

bench: control-plane toxiproxy postgres ## Benchmarks side by side with their baselines (release build; table + target/bench/latest.json); BENCH_ARGS="--measures 10" is the 10-minute soak
	$(CARGO) run --locked --release -p scale-agent-bench -- $(BENCH_ARGS)

fmt: ## Format the code
	$(CARGO) fmt --all

lint: ## Formatting check and clippy only
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# The integration tests listed here start no control plane and need no tool it builds: every test
# file of hub, crds, proto and the agent, and e2e's version check. The rest of e2e and bench start one.
unit: ## Tests that need no control plane: every library and binary test, and every integration test that starts none
	$(CARGO) test --workspace --locked --lib --bins
	$(CARGO) test --locked -p scale-agent-hub -p scale-agent-crds -p scale-agent-proto -p scale-agent --test '*'
	$(CARGO) test --locked -p scale-agent-e2e --test version

crds: ## Regenerate manifests/crds from the Rust types in crds/
	$(CARGO) run --locked -p scale-agent-crds --bin crdgen -- manifests/crds

proto: ## Regenerate proto/src/gen from proto/proto (no protoc needed)
	@# protogen links the library, which includes the checked-in generated file (and code
	@# that uses its types), so it builds against the old file and then overwrites it. If
	@# the old file no longer compiles, `git checkout proto/src/gen` and run this again.
	$(CARGO) run --locked -p scale-agent-proto --features codegen --bin protogen

# Container images ----------------------------------------------------------------------------

.PHONY: images version

images: ## Build the operator, agent and hub images as OCI layouts in target/images (release build; no container engine)
	@images/build.sh

version: ## Write the workspace version (Cargo.toml) into the manifests, the chart and the Dockerfile
	@images/stamp-version.sh
