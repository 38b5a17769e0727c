# syntax=docker/dockerfile:1
# kadmit's image: a static binary (CGO off) on distroless "static" as the
# nonroot user. The build stage runs on the builder's platform and
# cross-compiles for the target one.
#
# test/deploy runs this build stage's RUN lines as a script (no container
# engine there) and checks that the binary is static; keep its commands
# relative to WORKDIR and its outputs under it.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Modules first: this layer is reused while only sources change.
# pkg/webhookcerts is a module of its own that kadmit requires through a
# replace: its go.mod is needed before the download.
COPY go.mod go.sum ./
COPY pkg/webhookcerts/go.mod ./pkg/webhookcerts/
RUN go mod download
COPY cmd ./cmd
COPY internal ./internal
COPY pkg ./pkg
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
      -ldflags "-s -w -X github.com/kadmit/kadmit/internal/version.Version=$VERSION" \
      -o out/kadmit ./cmd/kadmit

# static-debian12 carries CA certificates and /etc/passwd with nonroot
# (65532), nothing else: no shell, no libc.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/out/kadmit /kadmit
USER 65532:65532
ENTRYPOINT ["/kadmit"]
CMD ["serve"]
