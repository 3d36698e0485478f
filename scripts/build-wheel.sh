#!/usr/bin/env bash
# Builds the oxgen Python wheel (abi3, Linux x86_64) into target/wheels: the native module
# (crates/python) and the `oxgen` command, the release CLI shipped as the wheel's script
# ($OXGEN_WHEEL_CLI names an `oxgen` binary already built to ship instead; the test suite
# passes its test-profile one rather than building the CLI twice). maturin comes from PyPI
# into .cache/build-venv (or $OXGEN_BUILD_VENV). Extra arguments go to `maturin build`.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${OXGEN_BUILD_VENV:-.cache/build-venv}
if [ ! -x "$venv/bin/maturin" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q maturin==1.16.0
fi

cli=${OXGEN_WHEEL_CLI:-}
if [ -z "$cli" ]; then
    cargo build --locked --release -p oxgen-cli
    cli=target/release/oxgen
fi
mkdir -p crates/python/data/scripts
cp "$cli" crates/python/data/scripts/oxgen
strip crates/python/data/scripts/oxgen 2>/dev/null || true
rm -f target/wheels/oxgen-*.whl
"$venv/bin/maturin" build --locked --release --strip -m crates/python/Cargo.toml --out target/wheels "$@"
