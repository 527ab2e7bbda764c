# syntax=docker/dockerfile:1
#
# coordd (the default target) and the example MCP server mdn-mcp, each a
# static binary on distroless, running as the unprivileged user nonroot.
#
#   docker build -t coordd .
#   docker build --target mdn-mcp -t mdn-mcp .
#
# deploy/deploy_test.go checks this file's stages (there is no image build
# in the tests).

# Keep in step with the go directive of go.mod (the test checks it).
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/coordd ./cmd/mdn-mcp

FROM gcr.io/distroless/static-debian12:nonroot AS mdn-mcp
COPY --from=build /out/mdn-mcp /usr/local/bin/mdn-mcp
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/mdn-mcp"]

FROM gcr.io/distroless/static-debian12:nonroot AS coordd
COPY --from=build /out/coordd /usr/local/bin/coordd
USER nonroot:nonroot
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/coordd"]
# Listen on every interface of the container (the binary's default is
# loopback). Arguments given to `docker run` replace these.
CMD ["--listen", ":50051"]
