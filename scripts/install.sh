#!/usr/bin/env bash
# Builds the extension (release) and installs it into the server that
# `pg_config` (or $PG_CONFIG) names.
#
# Each file is written next to its destination and renamed over it, so a
# server that is running keeps the library it has mapped until it restarts.
# `cargo pgrx install` rewrites lambdastore.so in place, and then every
# process that has it loaded (with shared_preload_libraries, all of them)
# crashes at its next call into it: `make test` while `make demo` runs
# took the demo's server down.
#
#   scripts/install.sh               build, then install
#   scripts/install.sh --no-build    install the last build again
#   scripts/install.sh --build-only  only build, into target/package (the images' input)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
pg_config=$(command -v "${PG_CONFIG:-pg_config}")
package=$repo/target/package

if [ "${1:-}" != --no-build ]; then
  rm -rf "$package"
  (cd "$repo/extension" && cargo pgrx package --pg-config "$pg_config" --out-dir "$package")
fi
[ -d "$package" ] || { echo "no build in $package: run scripts/install.sh first" >&2; exit 1; }
[ "${1:-}" = --build-only ] && exit 0

# The package mirrors the destination tree: $package/usr/lib/..., etc.
cd "$package"
find . -type f | while read -r file; do
  dest=/${file#./}
  mode=0644
  [[ $dest == *.so ]] && mode=0755
  tmp=$(dirname "$dest")/.$(basename "$dest").installing
  install -D -m "$mode" "$file" "$tmp"
  mv -f "$tmp" "$dest"
  echo "installed $dest"
done
