# The LambdaStore HTTP gateway (gateway/). Built from the repository's root:
#
#   docker compose build
#   docker build -f docker/gateway.Dockerfile -t lambdastore/gateway .
#
# LAMBDASTORE_FROM=source builds it here, in RUST_IMAGE (the default);
# LAMBDASTORE_FROM=prebuilt takes docker/prebuilt/lambdastore-gateway, built
# on a Debian 12 machine (scripts/docker.sh). As in postgres.Dockerfile, a
# build that cannot download needs BuildKit, which skips the unused stage.
#
# Configured by its environment (gateway/src/config.rs): LAMBDASTORE_DATABASE_URL,
# LAMBDASTORE_LISTEN, LAMBDASTORE_POOL_SIZE, ...

ARG DEBIAN_IMAGE=debian:bookworm-slim
ARG RUST_IMAGE=rust:1.95-bookworm
ARG LAMBDASTORE_FROM=source

FROM ${RUST_IMAGE} AS gateway-source
WORKDIR /src
# The whole workspace: cargo reads every member's manifest.
COPY Cargo.toml Cargo.lock Makefile rustfmt.toml ./
COPY .cargo .cargo
COPY core core
COPY third_party third_party
COPY extension extension
COPY sql sql
COPY guest-sdk guest-sdk
COPY gateway gateway
COPY tests tests
COPY bench bench
RUN cargo build --release -p lambdastore-gateway \
 && install -D target/release/lambdastore-gateway /out/lambdastore-gateway

FROM scratch AS gateway-prebuilt
COPY docker/prebuilt/ /out/

FROM gateway-${LAMBDASTORE_FROM} AS gateway

FROM ${DEBIAN_IMAGE}
# curl: the health check asks /readyz.
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home lambdastore
COPY --from=gateway /out/lambdastore-gateway /usr/local/bin/lambdastore-gateway
USER lambdastore
ENV LAMBDASTORE_LISTEN=127.0.0.1:8080
ENTRYPOINT ["lambdastore-gateway"]
