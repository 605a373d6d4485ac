'use strict';
// mime-types for the bundles (scripts/bundle.mjs resolves 'mime-types' here). Loading the
// package parses mime-db's 2,500 types and builds its two maps, scoring every extension
// conflict: the largest single cost of a daemon's start after Node.js itself (~30-50 ms of CPU
// on the 2-core bench machine, while a restore's replay wants both cores). Express, body-parser
// (type-is), accepts and send call only `lookup` and `contentType`, natgw's API with the few
// types below; those are answered from a table, everything else by the package itself, loaded
// on first use. test/unit/mime-types-lean.test.ts checks every answer against the package.
let full;
// A path, not the name: the bundler resolves the name to this file. Bundled, it runs at first call.
const pkg = () => {
  if (full === undefined) full = require('../node_modules/mime-types/index.js');
  return full;
};

// Extension (or name) → type, as the package's `types` map has them.
const TYPES = { json: 'application/json', html: 'text/html', text: 'text/plain', txt: 'text/plain', bin: 'application/octet-stream' };
// Type → the charset the package adds (mime-db's, or UTF-8 for text/*); '' for none.
const CHARSETS = { 'application/json': 'utf-8', 'text/html': 'utf-8', 'text/plain': 'utf-8', 'application/octet-stream': '' };

function lookup(p) {
  if (typeof p === 'string' && Object.hasOwn(TYPES, p)) return TYPES[p];
  return pkg().lookup(p);
}

function contentType(str) {
  if (typeof str !== 'string' || str === '') return pkg().contentType(str);
  const mime = str.indexOf('/') === -1 ? (Object.hasOwn(TYPES, str) ? TYPES[str] : undefined) : str;
  if (mime === undefined) return pkg().contentType(str);
  // The package's own rule: a type that names a charset is returned as given.
  if (mime.indexOf('charset') !== -1) return mime;
  if (!Object.hasOwn(CHARSETS, mime)) return pkg().contentType(str);
  return CHARSETS[mime] === '' ? mime : `${mime}; charset=${CHARSETS[mime]}`;
}

module.exports = {
  lookup,
  contentType,
  charset: (t) => pkg().charset(t),
  extension: (t) => pkg().extension(t),
  get charsets() {
    return pkg().charsets;
  },
  get extensions() {
    return pkg().extensions;
  },
  get types() {
    return pkg().types;
  },
};
