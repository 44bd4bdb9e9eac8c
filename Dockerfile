# syntax=docker/dockerfile:1

# Images of throttle and of the two example programs that the compose stack
# uses. The default (last) target is the throttle image:
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#                --build-arg COMMIT=$(git rev-parse --short HEAD) -t throttle .
#   docker run --rm throttle version
#
# Targets: throttle (default), mocksink, producer. Each final image is
# distroless (no shell, no package manager), holds one static binary, and
# runs as the unprivileged user nonroot (65532).

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
ENV CGO_ENABLED=0
# Dependencies first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .

FROM build AS build-throttle
ARG VERSION=dev
ARG COMMIT=unknown
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath \
      -ldflags "-s -w -X github.com/throttlehq/throttle/internal/cli.version=${VERSION} -X github.com/throttlehq/throttle/internal/cli.commit=${COMMIT}" \
      -o /out/throttle ./cmd/throttle

FROM build AS build-examples
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w" -o /out/ ./examples/mocksink ./examples/producer

# The mock HTTP provider of the compose stack (examples/mocksink).
FROM gcr.io/distroless/static-debian12:nonroot AS mocksink
COPY --from=build-examples /out/mocksink /mocksink
USER nonroot:nonroot
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/mocksink", "-check", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/mocksink"]

# The one-shot loader of sample messages (examples/producer).
FROM gcr.io/distroless/static-debian12:nonroot AS producer
COPY --from=build-examples /out/producer /producer
USER nonroot:nonroot
ENTRYPOINT ["/producer"]

# throttle itself. Mount a config file and run it:
#   docker run -v $PWD/throttle.yaml:/etc/throttle/config.yaml:ro -p 127.0.0.1:9464:9464 throttle
# The config's metrics.listen must be 0.0.0.0:9464 (its default, 127.0.0.1,
# is unreachable from outside the container) for the port mapping and for
# the health check, which probes /healthz on 127.0.0.1:9464.
FROM gcr.io/distroless/static-debian12:nonroot AS throttle
COPY --from=build-throttle /out/throttle /throttle
USER nonroot:nonroot
EXPOSE 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["/throttle", "healthcheck"]
ENTRYPOINT ["/throttle"]
CMD ["run", "--config", "/etc/throttle/config.yaml"]
