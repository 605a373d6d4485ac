'use strict';
// What natgw imports from prom-client, for the bundles (scripts/bundle.mjs resolves
// 'prom-client' here): the package's index also loads its Pushgateway (node:https, node:tls,
// node:zlib), cluster aggregation and Summary, which natgw never uses, and every built-in module
// is compiled at each daemon start (src/daemon/nodeFlags.ts). test/unit/prom-client-lean.test.ts
// keeps this list equal to what src/ imports.
const Registry = require('prom-client/lib/registry');

module.exports = {
  Registry,
  register: Registry.globalRegistry,
  Counter: require('prom-client/lib/counter'),
  Gauge: require('prom-client/lib/gauge'),
  Histogram: require('prom-client/lib/histogram'),
  collectDefaultMetrics: require('prom-client/lib/defaultMetrics'),
};
