#!/usr/bin/env bash
# The project's images from this checkout, with the inputs built on this
# machine: the extension, the example lambdas and the gateway (a Debian 12
# machine set up by `make setup`), and Citus' source when a copy of its
# tarball is at hand. docker/prebuilt/README.md lists them.
#
#   scripts/docker.sh build [node|gateway...]  fill docker/prebuilt, build the images (both by default)
#   scripts/docker.sh compose ARGS...           docker compose (or docker-compose 1.x) with ARGS
#   scripts/docker.sh engine                    exit 0 if a Docker engine answers
#   scripts/docker.sh claim RUN                 remove what killed test runs left; print RUN's lock file
#   scripts/docker.sh free-ports N              N ports free on 127.0.0.1 now, comma-separated
#
# The images are lambdastore/postgres:latest and lambdastore/gateway:latest,
# the names docker-compose.yml gives them. A user with a registry at hand
# needs none of this: `docker compose build` builds everything from source.
#
# LAMBDASTORE_CITUS_TARBALL names Citus' release tarball (default: the copy
# beside the clone, ../shared/citus/citus-13.2.2.tar.gz); without one the
# build downloads it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
citus_version=13.2.2
tarball=${LAMBDASTORE_CITUS_TARBALL:-$repo/../shared/citus/citus-$citus_version.tar.gz}
prebuilt=$repo/docker/prebuilt

engine() { docker info >/dev/null 2>&1; }

# docker build with BuildKit, which skips the stages that download what
# docker/prebuilt holds. Docker 23 and later build with it (through buildx);
# an older client has it built in, with DOCKER_BUILDKIT=1. A machine may have
# both (Debian's docker.io and a newer client without buildx): each client
# on PATH is tried.
buildkit_build() {
  local client version
  if docker buildx version >/dev/null 2>&1; then
    docker build "$@"
    return
  fi
  for client in $(type -ap docker); do
    version=$("$client" version --format '{{.Client.Version}}' 2>/dev/null) || continue
    if [ "${version%%.*}" -lt 23 ]; then
      DOCKER_BUILDKIT=1 "$client" build "$@"
      return
    fi
  done
  echo "docker.sh: no docker client builds with BuildKit here (no buildx, and no client older than 23)" >&2
  return 1
}

# The inputs, as docker/prebuilt/README.md lists them.
fill_prebuilt() {
  local what=$1
  mkdir -p "$prebuilt"
  if [ "$what" = node ]; then
    scripts/install.sh --build-only >/dev/null 2>&1 || scripts/install.sh --build-only
    LAMBDASTORE_SKIP_SETUP=1 make -s lambdas >/dev/null 2>&1 || LAMBDASTORE_SKIP_SETUP=1 make -s lambdas
    rm -rf "$prebuilt/package" "$prebuilt/lambdas"
    # install.sh packages into the checkout's target/, whatever
    # CARGO_TARGET_DIR says.
    cp -a target/package "$prebuilt/package"
    mkdir -p "$prebuilt/lambdas"
    cp target/lambdas/*.wasm "$prebuilt/lambdas/"
    if [ -f "$tarball" ]; then
      cp "$tarball" "$prebuilt/citus-$citus_version.tar.gz"
    fi
  elif [ -n "${LAMBDASTORE_GATEWAY_BINARY:-}" ]; then
    # A gateway built already (make test: the test build's, unoptimized,
    # which the compose test's few requests do not notice): no release
    # build of its own, minutes of CI.
    cp "$LAMBDASTORE_GATEWAY_BINARY" "$prebuilt/lambdastore-gateway"
  else
    cargo build -q --release -p lambdastore-gateway
    cp "${CARGO_TARGET_DIR:-target}/release/lambdastore-gateway" "$prebuilt/lambdastore-gateway"
  fi
}

# Runs a build with its output in target/docker-IMAGE.log, shown on failure.
logged() {
  local log=$repo/target/docker-$1.log
  shift
  mkdir -p "$repo/target"
  "$@" >"$log" 2>&1 || { tail -30 "$log" >&2; echo "docker.sh: the build failed; all of it in $log" >&2; return 1; }
}

build() {
  local images=("$@") image tag started old citus_from
  [ ${#images[@]} -gt 0 ] || images=(node gateway)
  # Builds of this checkout take turns (make test-citus beside make
  # test-compose): they share docker/prebuilt and target/package. The lock
  # goes with this process.
  mkdir -p "$repo/target"
  exec 9>"$repo/target/docker-build.lock"
  flock -w 3600 9 || { echo "docker.sh: another build of this checkout holds target/docker-build.lock" >&2; return 1; }
  for image in "${images[@]}"; do
    case $image in
      node) tag=lambdastore/postgres:latest ;;
      gateway) tag=lambdastore/gateway:latest ;;
      *) echo "docker.sh: unknown image $image (node, gateway)" >&2; exit 2 ;;
    esac
    started=$SECONDS
    old=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
    fill_prebuilt "$image"
    if [ "$image" = node ]; then
      citus_from=download
      [ -f "$prebuilt/citus-$citus_version.tar.gz" ] && citus_from=prebuilt
      logged "$image" buildkit_build --network host --progress plain -f docker/postgres.Dockerfile -t "$tag" \
        --build-arg LAMBDASTORE_FROM=prebuilt --build-arg CITUS_FROM=$citus_from .
    else
      logged "$image" buildkit_build --network host --progress plain -f docker/gateway.Dockerfile -t "$tag" \
        --build-arg LAMBDASTORE_FROM=prebuilt .
    fi
    # The image the tag named before, untagged now: each rebuild would keep one.
    if [ -n "$old" ] && [ "$old" != "$(docker image inspect --format '{{.Id}}' "$tag")" ]; then
      docker rmi "$old" >/dev/null 2>&1 || true
    fi
    echo "docker.sh: built $tag in $((SECONDS - started)) s"
  done
}

# Test runs on containers (e2e-citus.sh, e2e-compose.sh) name them after
# the run, RUN, and hold a lock on $runs/RUN (flock) for as long as they
# live. A file nobody holds is a run killed before its trap could clean up
# (SIGKILL, a CI timeout): its containers and volumes go, those of the
# Citus tests (lambdastore-citus-test-RUN-*) and of the compose project
# (lambdastore-compose-test-RUN). Prints the file a new run RUN must hold.
runs=${TMPDIR:-/tmp}/lambdastore-test-runs
claim() {
  local lock run
  mkdir -p "$runs"
  for lock in "$runs"/*; do
    [ -f "$lock" ] && flock -n "$lock" true || continue
    run=${lock##*/}
    echo "docker.sh: removing what the killed test run $run left" >&2
    docker ps -aq --filter "name=^lambdastore-citus-test-$run-" | xargs -r docker rm -f >/dev/null
    docker ps -aq --filter "label=com.docker.compose.project=lambdastore-compose-test-$run" \
      | xargs -r docker rm -f >/dev/null
    docker volume ls -q --filter "label=com.docker.compose.project=lambdastore-compose-test-$run" \
      | xargs -r docker volume rm >/dev/null
    rm -f "$lock"
  done
  echo "$runs/$1"
}

# N ports on 127.0.0.1 that are free now, for the test runs' containers
# (e2e-compose.sh, tests/tests/common/cluster.rs): the first that bind, from
# a random place in 20000–32767 on, all held until all are found. That range
# lies below the one the kernel takes outgoing connections' local ports from
# (32768–60999), so no connection takes a picked port before its node
# listens on it, and away from the project's fixed ports (543xx,
# 8080–8090). A small race remains: another run's pick, starting within a
# few ports below, at that moment; the node then fails to start, naming
# the port. perl-base is part of every Debian.
free_ports() {
  perl -MIO::Socket::INET -e '
    my ($n, $first, $len) = ($ARGV[0], 20000, 12768);
    my ($start, @held) = (int rand $len);
    for my $i (0 .. $len - 1) {
      last if @held == $n;
      my $socket = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => $first + ($start + $i) % $len,
                                         Listen => 1);
      push @held, $socket if $socket;
    }
    @held == $n or die "free_ports: not $n free ports on 127.0.0.1 in 20000-32767\n";
    print join(",", map { $_->sockport } @held), "\n"' "$1"
}

# Compose v2 (`docker compose`) where there is one, else docker-compose 1.x.
compose() {
  if docker compose version >/dev/null 2>&1; then
    docker compose "$@"
  else
    docker-compose "$@"
  fi
}

case ${1:-} in
  build) shift; build "$@" ;;
  compose) shift; compose "$@" ;;
  engine) engine ;;
  claim) [ $# = 2 ] || { echo "usage: docker.sh claim RUN" >&2; exit 2; }; claim "$2" ;;
  free-ports) [[ ${2:-} =~ ^[1-9][0-9]?$ ]] || { echo "usage: docker.sh free-ports N" >&2; exit 2; }; free_ports "$2" ;;
  *) echo "usage: docker.sh build [node|gateway...] | compose ARGS... | engine | claim RUN | free-ports N" >&2; exit 2 ;;
esac
