# The operator, agent and hub images for people who build with a container engine; `make images`
# builds the same images without one. Both put the same files in the image: the build stage
# runs images/image.sh rootfs, as `make images` does.
#
#   docker build --target hub --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     -t registry.example.com/scale-agent/hub:v0.1.0 .
#
# Targets: operator, agent, hub. The build stage's glibc is the one the images carry.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p scale-agent-operator -p scale-agent -p scale-agent-hub --bins \
 && images/image.sh rootfs target/release/scale-agent-operator scale-agent-operator /out/operator \
 && images/image.sh rootfs target/release/scale-agent scale-agent /out/agent \
 && images/image.sh rootfs target/release/scale-agent-hub scale-agent-hub /out/hub

FROM scratch AS common
ARG VERSION=0.1.0
ARG REVISION=unknown
ENV PATH=/usr/local/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /
LABEL org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.revision=$REVISION \
      org.opencontainers.image.source=https://github.com/scale-agent/scale-agent \
      org.opencontainers.image.licenses=Apache-2.0

FROM common AS operator
COPY --from=build /out/operator/ /
LABEL org.opencontainers.image.title=scale-agent-operator
ENTRYPOINT ["/usr/local/bin/scale-agent-operator"]

FROM common AS agent
COPY --from=build /out/agent/ /
LABEL org.opencontainers.image.title=scale-agent
ENTRYPOINT ["/usr/local/bin/scale-agent"]

FROM common AS hub
COPY --from=build /out/hub/ /
LABEL org.opencontainers.image.title=scale-agent-hub
ENTRYPOINT ["/usr/local/bin/scale-agent-hub"]
