// Writes dist/version.json after tsc (`npm run build`, and the image's build stage), for
// `natgw --version` (src/cli/version.ts): the package's version and the source revision.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

// The revision: NATGW_REVISION where the build sets it (the image's build stage has no
// .git), else git's commit (`-dirty` with uncommitted changes to tracked files), else unknown.
const git = (...args) => {
  try {
    return execFileSync('git', ['-C', root, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return '';
  }
};
const commit = git('rev-parse', 'HEAD');
const revision =
  process.env.NATGW_REVISION?.trim() || (commit ? `${commit}${git('status', '--porcelain', '--untracked-files=no') ? '-dirty' : ''}` : 'unknown');
const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
writeFileSync(join(root, 'dist', 'version.json'), `${JSON.stringify({ version, revision })}\n`);
