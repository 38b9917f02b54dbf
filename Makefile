# projector: Kafka event streams into versioned read models in PostgreSQL.

GO       ?= go
PROJECTOR_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
export PROJECTOR_DATABASE_URL

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/projector and bin/projector-bench.
	$(GO) build -o bin/projector ./cmd/projector
	$(GO) build -o bin/projector-bench ./cmd/projector-bench

.PHONY: demo
demo: ## Run the demo: embedded broker and registry, real Postgres, verified summary.
	$(GO) run ./cmd/projector demo

.PHONY: test
test: ## Run the whole test suite with the race detector, every Go microbenchmark once, and the Helm chart's tests.
	$(GO) test -race -count=1 -timeout 15m ./...
	cd deploy/composecheck && $(GO) test -race -count=1 ./...
	$(GO) test -short -run '^$$' -bench . -benchtime 1x ./...
	cd deploy/helm/chartcheck && $(GO) test -count=1 ./...

.PHONY: test-kafka
test-kafka: ## Run the end-to-end and fault suites on Apache Kafka 4.4, started here and stopped after (needs Java 17 and Maven).
	GO=$(GO) scripts/test-kafka

.PHONY: kafka-up
kafka-up: ## Start Apache Kafka on 127.0.0.1, fetched from Maven Central on first use (KAFKA_FLAGS="--brokers 3").
	scripts/kafka up $(KAFKA_FLAGS)

.PHONY: kafka-down
kafka-down: ## Stop the Kafka that kafka-up started and delete its data.
	scripts/kafka down

.PHONY: bench
bench: ## projector-bench: engine vs COPY limit and hand-written consumers (BENCH_FLAGS="--runs 3"); BENCH=go: the Go microbenchmarks.
ifeq ($(BENCH),go)
	$(GO) test -run '^$$' -bench . -benchmem ./...
else
	$(GO) run ./cmd/projector-bench $(BENCH_FLAGS)
endif

# bench-kafka runs a Kafka of its own (its state and ports apart from kafka-up's, which it
# never stops) and stops it when the run ends, whatever the outcome.
BENCH_KAFKA_FLAGS ?= --reorder 0.02 --duplicate 0.02
BENCH_KAFKA_PORT ?= 28192
BENCH_KAFKA_ENV = PROJECTOR_KAFKA_RUN=$(CURDIR)/.cache/kafka/bench-run PROJECTOR_KAFKA_PORT=$(BENCH_KAFKA_PORT)

.PHONY: bench-kafka
bench-kafka: ## projector-bench on Apache Kafka 4.4: engine snapshot and fold vs Kafka Connect with the Debezium JDBC sink (BENCH_KAFKA_FLAGS="--runs 3").
	@trap '$(BENCH_KAFKA_ENV) scripts/kafka down' EXIT; trap 'exit 130' INT TERM; \
	brokers=$$($(BENCH_KAFKA_ENV) scripts/kafka up | sed -n 's/^PROJECTOR_TEST_KAFKA_BROKERS=//p'); \
	test -n "$$brokers" || exit 1; \
	$(GO) run ./cmd/projector-bench --brokers "$$brokers" --modes engine-snapshot,engine-fold,connect-jdbc $(BENCH_KAFKA_FLAGS)

.PHONY: lint
lint: ## gofmt and go vet.
	@test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)
	$(GO) vet ./...
	cd deploy/helm/chartcheck && $(GO) vet ./...

.PHONY: docs
docs: ## Regenerate docs/configuration.md and docs/metrics.md from the flags and the metric registry, and docs/asyncapi/ from examples/.
	$(GO) test -count=1 -run 'TestConfigReference|TestMetricsReference|TestAsyncAPIDocuments' ./cmd/projector -update
