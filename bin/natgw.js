#!/usr/bin/env node
// The package's bin: run the compiled CLI (npm run build produces dist/).
import '../dist/src/cli/main.js';
