/** Rewrites the README's configuration table from the config schema (`npm run docs:config`). */
import { readFile, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { withConfigTable } from './configDoc.js';

const readme = fileURLToPath(new URL('../../README.md', import.meta.url));
const before = await readFile(readme, 'utf8');
const after = withConfigTable(before);
if (after !== before) await writeFile(readme, after);
console.log(after === before ? 'README configuration table is up to date' : 'README configuration table rewritten');
