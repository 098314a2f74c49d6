#!/usr/bin/env bash
# The README's test command: every test of the workspace, then the doctests.
#
# With cargo-nextest (preinstalled on the project's CI machines; `cargo install --locked
# cargo-nextest` elsewhere) each test runs in a process of its own, the three real stacks' lanes
# side by side (.config/nextest.toml: one local-stack test, one node test and one bare apiserver
# test at a time), every test bounded (slow after 2 minutes, ended after 20). Without
# it, `cargo test` runs the same tests one file at a time: the same verdicts, slower.
# Extra arguments go to the test runner: `./scripts/test.sh --test local_target`.
set -euo pipefail
cd "$(dirname "$0")/.."
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace "$@"
else
  echo "test.sh: cargo-nextest not found; running the tests one file at a time with cargo test" >&2
  cargo test --workspace --tests "$@"
fi
# nextest does not run doctests; neither does `cargo test --tests`.
if [ $# -eq 0 ]; then
  cargo test --workspace --doc
fi
