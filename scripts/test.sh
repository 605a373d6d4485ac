#!/usr/bin/env bash
# One command for the whole test suite: set-up, then build and every test (unit, API, real kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
npm test
