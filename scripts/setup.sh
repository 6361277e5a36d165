#!/usr/bin/env bash
# `make setup`, the first step of `make demo` and `make test`: installs what
# a fresh Debian 12 (bookworm) machine lacks to build and test the project.
#
#   Debian packages   PostgreSQL 15 with its headers, clang, ... (apt-get: needs root)
#   Rust              the wasm32-unknown-unknown target (rustup)
#   cargo-pgrx        the version extension/Cargo.toml pins, and `cargo pgrx init --pg15`
#   componentize-py   pinned, with pytest, from PyPI into target/python (a virtualenv):
#                     it builds the Python examples (guest-sdk/python)
#
# Idempotent: each step is checked first (dpkg-query, rustup, cargo pgrx
# --version, ~/.pgrx/config.toml), so on a machine that has everything it
# only checks, in a fraction of a second, and prints nothing. apt-get runs
# only for packages that are missing. Without root it installs no Debian
# package: it prints the commands to run and stops. Rust itself (rustup) is
# not installed here; a missing one is reported with its one-line install.
#
# LAMBDASTORE_SKIP_SETUP=1 skips all of it (a machine set up another way).
# LAMBDASTORE_SETUP_EXTRA_PACKAGES="pkg ..." adds packages to the list; it
# exists to exercise the missing-package path on a complete machine.
set -euo pipefail
[ "${LAMBDASTORE_SKIP_SETUP:-}" = 1 ] && exit 0
repo=$(cd "$(dirname "$0")/.." && pwd)

# Server, client and headers from the same Debian release, so they match;
# clang and libclang for pgrx's bindgen; curl for the demo's HTTP call; a
# font for the benchmark's PNG plots.
packages=(postgresql-15 postgresql-server-dev-15 postgresql-client-15
          build-essential clang libclang-dev pkg-config ca-certificates curl
          fonts-dejavu-core python3-venv ${LAMBDASTORE_SETUP_EXTRA_PACKAGES:-})
pg_config=/usr/lib/postgresql/15/bin/pg_config
wasm_target=wasm32-unknown-unknown
# cargo-pgrx must be exactly the version of the pgrx crate it builds.
pgrx_version=$(sed -n 's/^pgrx = "=\([0-9.]*\)".*/\1/p' "$repo/extension/Cargo.toml")
[ -n "$pgrx_version" ] || { echo "setup: no pinned pgrx version in extension/Cargo.toml" >&2; exit 1; }
rustup_line='curl --proto =https --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y && . "$HOME/.cargo/env"'

# rustup installs into ~/.cargo/bin, which a new login shell puts on PATH.
export PATH="$PATH:$HOME/.cargo/bin"
say() { echo "setup: $*"; }
todo=()   # commands for the user, for what this run cannot do itself

# Debian packages: one dpkg-query for all of them.
if command -v dpkg-query >/dev/null; then
  installed=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${packages[@]}" 2>/dev/null || true)
  missing=()
  for p in "${packages[@]}"; do
    grep -qx "$p installed" <<<"$installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      say "installing Debian packages: ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      # Waits for another apt-get (e.g. unattended upgrades) instead of failing.
      apt=(apt-get -qq -o DPkg::Lock::Timeout=300)
      "${apt[@]}" update
      "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
    else
      say "missing Debian packages, which only root may install: ${missing[*]}" >&2
      todo+=("sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}")
    fi
  fi
else
  say "no dpkg-query: not Debian, so install PostgreSQL 15 with its server headers, clang," \
      "libclang, pkg-config and curl yourself (LAMBDASTORE_SKIP_SETUP=1 silences this)" >&2
fi

if ! command -v rustup >/dev/null || ! command -v cargo >/dev/null; then
  say "missing Rust (rustup and cargo; the wasm target needs rustup, not a distribution's Rust)" >&2
  todo+=("$rustup_line")
fi

if [ ${#todo[@]} -gt 0 ]; then
  {
    say "run these, then make again (LAMBDASTORE_SKIP_SETUP=1 skips these checks):"
    printf '    %s\n' "${todo[@]}"
  } >&2
  exit 1
fi

# The rest is per user and needs no root.
if ! rustup target list --installed | grep -qx "$wasm_target"; then
  say "adding the Rust target $wasm_target"
  rustup target add "$wasm_target"
fi

# make test checks the formatting (rustfmt.toml); minimal rustup profiles lack it.
if ! cargo fmt --version >/dev/null 2>&1; then
  say "adding rustfmt"
  rustup component add rustfmt
fi

if [ "$(cargo pgrx --version 2>/dev/null)" != "cargo-pgrx $pgrx_version" ]; then
  say "installing cargo-pgrx $pgrx_version (a few minutes)"
  cargo install cargo-pgrx --version "$pgrx_version" --locked
fi

# Any pg15 entry will do: a developer's own (e.g. a pgrx-managed build) is kept.
pgrx_config=${PGRX_HOME:-$HOME/.pgrx}/config.toml
if ! grep -qs '^pg15 = ' "$pgrx_config"; then
  say "cargo pgrx init --pg15 $pg_config"
  cargo pgrx init --pg15 "$pg_config" >/dev/null
fi

# The Python guests' build tool and test runner, pinned, in a virtualenv of
# the checkout (Makefile: PYTHON_VENV).
venv=$repo/target/python
componentize_py=0.25.1
if [ "$("$venv/bin/componentize-py" --version 2>/dev/null)" != "componentize-py $componentize_py" ]; then
  say "installing componentize-py $componentize_py and pytest into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "componentize-py==$componentize_py" "pytest==9.2.0"
fi
