/**
 * dashboards/natgw.json: a Grafana dashboard whose every query names only metrics natgw
 * exports. The registry is built exactly as `natgw serve` builds it (daemonMetrics), so a
 * renamed or removed metric fails here.
 */
import { describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from '../helpers/netns.js';
import { daemonMetrics } from '../../src/observe/observer.js';
import type { Executor } from '../../src/system/exec.js';
import { parse as parseYaml } from 'yaml';

interface Target {
  expr?: string;
}
interface Panel {
  type: string;
  title: string;
  targets?: Target[];
  panels?: Panel[];
}

const dashboard = JSON.parse(readFileSync(join(REPO_ROOT, 'dashboards', 'natgw.json'), 'utf8')) as {
  schemaVersion: number;
  panels: Panel[];
  templating: { list: { name: string; type: string; query: unknown; definition?: string }[] };
};

const noExec: Executor = {
  run: async (req) => ({ command: req.file, exitCode: 1, stdout: '', stderr: '', timedOut: false, failedToStart: true }),
};

/** Metric names natgw's registry exports, with a histogram's series names. */
function exported(): Set<string> {
  const { metrics } = daemonMetrics({
    config: { flowLog: 'off', conntrackMetrics: true, snatPortRange: { min: 1024, max: 65535 } },
    exec: noExec,
    eipTraffic: async () => [],
  });
  const names = new Set<string>();
  for (const m of metrics.registry.getMetricsAsArray()) {
    const { name, type } = m as unknown as { name: string; type: string };
    names.add(name);
    if (type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(name + s);
    if (type === 'summary') for (const s of ['_sum', '_count']) names.add(name + s);
  }
  return names;
}

const KEYWORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'bool', 'offset', 'and', 'or', 'unless', 'inf', 'nan']);

/** PURE: the metric names a PromQL expression selects (functions, label names, grouping and Grafana variables excluded). */
export function metricNames(expr: string): string[] {
  const stripped = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')
    .replace(/\{[^}]*\}/g, '')
    .replace(/\[[^\]]*\]/g, '')
    .replace(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, '')
    .replace(/\$\{?\w+\}?/g, '');
  const names: string[] = [];
  for (const m of stripped.matchAll(/[A-Za-z_:][A-Za-z0-9_:]*/g)) {
    const after = stripped.slice(m.index + m[0].length).trimStart();
    if (after.startsWith('(') || KEYWORDS.has(m[0].toLowerCase())) continue;
    names.push(m[0]);
  }
  return names;
}

function allPanels(ps: Panel[]): Panel[] {
  return ps.flatMap((p) => [p, ...allPanels(p.panels ?? [])]);
}

describe('Grafana dashboard', () => {
  const names = exported();
  const panels = allPanels(dashboard.panels);
  const exprs = panels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr ?? '' })));

  it('is a Grafana dashboard with a Prometheus data-source variable', () => {
    expect(dashboard.schemaVersion).toBeGreaterThanOrEqual(36);
    expect(dashboard.templating.list.find((v) => v.type === 'datasource')?.query).toBe('prometheus');
    expect(exprs.length).toBeGreaterThan(10);
  });

  it('the metric-name extraction reads PromQL as intended', () => {
    expect(metricNames('histogram_quantile(0.99, sum by (le) (rate(a_bucket{x=~"$i", y="b(c)"}[$__rate_interval])))')).toEqual(['a_bucket']);
    expect(metricNames('max by (instance) (a{i=~"$instance"} / b) * 8')).toEqual(['a', 'b']);
  });

  it('every query names only metrics natgw exports', () => {
    const unknown: string[] = [];
    for (const { panel, expr } of exprs) {
      const used = metricNames(expr);
      if (used.length === 0) unknown.push(`${panel}: no metric in ${expr}`);
      for (const n of used) if (!names.has(n)) unknown.push(`${panel}: ${n}`);
    }
    expect(unknown).toEqual([]);
  });

  it('covers syncs, drift repairs, latency, per-EIP traffic and connections, conntrack fill', () => {
    const used = new Set(exprs.flatMap((e) => metricNames(e.expr)));
    for (const n of [
      'natgw_syncs_total',
      'natgw_drift_repairs_total',
      'natgw_sync_duration_seconds_bucket',
      'natgw_eip_bytes',
      'natgw_conntrack_connections',
      'natgw_conntrack_entries',
      'natgw_conntrack_max',
    ]) {
      expect(used, n).toContain(n);
    }
  });

  it("shows SNAT port exhaustion: the busiest destination's share per EIP and the allocation failures", () => {
    const used = new Set(exprs.flatMap((e) => metricNames(e.expr)));
    for (const n of ['natgw_snat_port_usage_ratio', 'natgw_snat_port_allocation_failures_total']) expect(used, n).toContain(n);
  });

  it('the example alert rules next to it name only exported metrics, and alert on SNAT port exhaustion', () => {
    const file = parseYaml(readFileSync(join(REPO_ROOT, 'dashboards', 'natgw-alerts.yaml'), 'utf8')) as {
      groups: { name: string; rules: { alert: string; expr: string }[] }[];
    };
    const rules = file.groups.flatMap((g) => g.rules);
    expect(rules.length).toBeGreaterThan(0);
    const unknown = rules.flatMap((r) =>
      metricNames(r.expr)
        .filter((n) => !names.has(n))
        .map((n) => `${r.alert}: ${n}`),
    );
    expect(unknown).toEqual([]);
    const used = new Set(rules.flatMap((r) => metricNames(r.expr)));
    expect(used).toContain('natgw_snat_port_usage_ratio');
    expect(used).toContain('natgw_snat_port_allocation_failures_total');
  });

  it('its variables query exported metrics too', () => {
    for (const v of dashboard.templating.list.filter((x) => x.type === 'query')) {
      const m = /label_values\((\w+)/.exec(v.definition ?? '');
      expect(m && names.has(m[1]!), v.name).toBe(true);
    }
  });
});
