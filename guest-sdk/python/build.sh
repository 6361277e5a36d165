#!/bin/sh
# Builds a Python LambdaStore application into a component:
#   guest-sdk/python/build.sh APP_DIR OUT.wasm
# APP_DIR holds the module `app` (app.py), which defines `WitWorld`.
#
# --stub-wasi: a lambda may import nothing but lambdastore:lambda/{host,later},
# and the extension links nothing else, but the Python runtime imports WASI;
# its imports become traps. Python's interpreter is initialized at build
# time, so nothing a lambda does at run time reaches them (no files, clock
# or randomness but the host's).
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 APP_DIR OUT.wasm" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
wit="$here/../wit"

exec componentize-py -d "$wit" -w lambda componentize --stub-wasi \
    -p "$1" -p "$here" app -o "$2"
