# A PostgreSQL node of a LambdaStore cluster: PostgreSQL, Citus and
# lambdastore, both preloaded (citus first), ready to be the coordinator or
# a worker (docker-compose.yml says which). Built from the repository's root:
#
#   docker compose build
#   docker build -f docker/postgres.Dockerfile -t lambdastore/postgres .
#
# PostgreSQL is the base image's Debian package: debian:bookworm-slim has
# PostgreSQL 15, so PG_MAJOR is 15, and the extension is built with pgrx's
# feature pg$PG_MAJOR. Another base names its own major (trixie: 17).
#
# Where the extension and Citus come from (build arguments):
#   LAMBDASTORE_FROM=source    built here, in RUST_IMAGE with cargo-pgrx (the default)
#   LAMBDASTORE_FROM=prebuilt  docker/prebuilt/package and lambdas/ (scripts/docker.sh fills them)
#   CITUS_FROM=download        Citus' release tarball, from GitHub (the default)
#   CITUS_FROM=prebuilt        docker/prebuilt/citus-$CITUS_VERSION.tar.gz
# Citus is compiled here either way, against this image's PostgreSQL.
# BuildKit (the default builder since Docker 23; DOCKER_BUILDKIT=1 on 20.10)
# runs only the stages a build uses; the classic builder runs them all, so
# without BuildKit the prebuilt inputs save nothing, and a build that cannot
# download fails.

ARG DEBIAN_IMAGE=debian:bookworm-slim
ARG RUST_IMAGE=rust:1.95-bookworm
ARG PG_MAJOR=15
ARG CITUS_VERSION=13.2.2
ARG PGRX_VERSION=0.18.0
ARG LAMBDASTORE_FROM=source
ARG CITUS_FROM=download

# --- Citus' source ------------------------------------------------------------
FROM scratch AS citus-download
ARG CITUS_VERSION
ADD https://github.com/citusdata/citus/archive/refs/tags/v${CITUS_VERSION}.tar.gz /in/citus-${CITUS_VERSION}.tar.gz

# The whole directory (it always exists), so that this stage also builds
# where it is not used.
FROM scratch AS citus-prebuilt
COPY docker/prebuilt/ /in/

FROM citus-${CITUS_FROM} AS citus-source

# --- Citus, compiled against the node's PostgreSQL ---------------------------
FROM ${DEBIAN_IMAGE} AS citus
ARG PG_MAJOR
ARG CITUS_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      postgresql-server-dev-${PG_MAJOR} build-essential liblz4-dev libzstd-dev libssl-dev \
      libkrb5-dev libselinux1-dev libxml2-dev libxslt1-dev libpam0g-dev libreadline-dev zlib1g-dev \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY --from=citus-source /in/citus-${CITUS_VERSION}.tar.gz /tmp/citus.tar.gz
# Debian's PostgreSQL 15 headers declare have_createdb_privilege()
# (backported from 16), which Citus' compatibility header defines again for
# PostgreSQL < 16: Citus' copy is renamed (a no-op where either lacks it).
# Citus' statistics collector (libcurl) is left out.
RUN mkdir /build && tar -xzf /tmp/citus.tar.gz -C /build --strip-components=1 && cd /build \
 && sed -i '/^have_createdb_privilege(void)$/i #define have_createdb_privilege citus_have_createdb_privilege_compat' \
      src/include/pg_version_compat.h \
 && ./configure --without-libcurl PG_CONFIG=/usr/lib/postgresql/${PG_MAJOR}/bin/pg_config >/dev/null \
 && make -j"$(nproc)" >/dev/null \
 && make install DESTDIR=/out >/dev/null

# --- The extension and the example lambdas, built here -------------------------
FROM ${RUST_IMAGE} AS lambdastore-source
ARG PG_MAJOR
ARG PGRX_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-server-dev-${PG_MAJOR} clang libclang-dev \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
RUN cargo install cargo-pgrx --version ${PGRX_VERSION} --locked \
 && cargo pgrx init --pg${PG_MAJOR} /usr/lib/postgresql/${PG_MAJOR}/bin/pg_config \
 && rustup target add wasm32-unknown-unknown
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
COPY scripts scripts
RUN cd extension \
 && cargo pgrx package --pg-config /usr/lib/postgresql/${PG_MAJOR}/bin/pg_config --out-dir /out/package \
      --no-default-features --features pg${PG_MAJOR}
RUN LAMBDASTORE_SKIP_SETUP=1 make lambdas && mkdir -p /out/lambdas && cp target/lambdas/*.wasm /out/lambdas/

# --- ... or built outside (scripts/docker.sh) ---------------------------------
FROM scratch AS lambdastore-prebuilt
COPY docker/prebuilt/ /out/

FROM lambdastore-${LAMBDASTORE_FROM} AS lambdastore

# --- The node -----------------------------------------------------------------
FROM ${DEBIAN_IMAGE}
ARG PG_MAJOR
# Debian's package would create and start a cluster of its own; the
# entrypoint makes the node's.
RUN mkdir -p /etc/postgresql-common \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-${PG_MAJOR} liblz4-1 libzstd1 \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY --from=citus /out/ /
COPY --from=lambdastore /out/package/ /
COPY --from=lambdastore /out/lambdas/ /usr/share/lambdastore/lambdas/
RUN ! ldd /usr/lib/postgresql/${PG_MAJOR}/lib/citus.so /usr/lib/postgresql/${PG_MAJOR}/lib/lambdastore.so | grep 'not found'
COPY docker/node.conf /etc/lambdastore/node.conf
COPY docker/node.sh /usr/local/bin/lambdastore-node
COPY docker/init.sh /usr/local/bin/lambdastore-init
ENV PATH=/usr/lib/postgresql/${PG_MAJOR}/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
RUN install -d -o postgres -g postgres -m 700 "$PGDATA" \
 && install -d -o postgres -g postgres -m 2775 /var/run/postgresql \
 && install -d -o postgres -g postgres -m 700 /var/lib/lambdastore
USER postgres
# PostgreSQL's fast shutdown: sessions are ended, the server checkpoints.
STOPSIGNAL SIGINT
ENTRYPOINT ["lambdastore-node"]
