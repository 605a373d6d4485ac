#!/usr/bin/env bash
# One command for natgw's main job, for real: set-up, build, then the namespace lab.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
npm run lab
