# The triage image: cmd/triage as one static binary on distroless, run as
# a non-root user. Every command is in it (sidecar, proxy, extproc,
# quota-server, loadtest): the Kubernetes kit (deploy/kubernetes) picks one
# with the container's args.
#
#   docker build --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) -t triage:v0.1.0 .
#
# VERSION and COMMIT are what `triage version` prints: the build context
# has no .git, so the build cannot read them itself.
#
# deploy/kubernetes/check builds the binary with this file's build
# command and checks it is static, and checks this file's shape (go test
# in that module; no container engine is needed).
ARG GO_VERSION=1.26.8
ARG VERSION=(devel)
ARG COMMIT=unknown

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION
ARG COMMIT
RUN CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/triage ./cmd/triage

# static: no libc (the binary needs none); nonroot: uid and gid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/triage /triage
USER 65532:65532
ENTRYPOINT ["/triage"]
