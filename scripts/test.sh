#!/usr/bin/env bash
# One command for the whole test suite: set-up (which builds), then biome and every test (unit,
# API, real kernel) against that build. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
npm run test:built
