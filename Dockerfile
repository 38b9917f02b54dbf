# syntax=docker/dockerfile:1

# Build: a static binary, no cgo.
FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so that source changes reuse this layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /projector ./cmd/projector

# The example service of the local stack (docker-compose.yml, service
# outbox-writer), built only when that target is asked for: the default
# image below does not contain it.
FROM build AS outbox-writer-build
RUN CGO_ENABLED=0 go build -trimpath -o /outbox-writer ./examples/outbox-writer

FROM gcr.io/distroless/static-debian12:nonroot AS outbox-writer
COPY --from=outbox-writer-build /outbox-writer /outbox-writer
USER 65532:65532
ENTRYPOINT ["/outbox-writer"]

# Run: distroless static image as the unprivileged "nonroot" user (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /projector /projector
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
# /metrics, /livez, /healthz and /readyz (--http-addr, default :8080).
EXPOSE 8080
ENTRYPOINT ["/projector"]
CMD ["run"]
