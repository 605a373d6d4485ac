/**
 * The agent commands' pure parts: the table, status and diff renderers and the state-file
 * parser (line and field of a bad file). The commands against a real daemon: test/netns/cli.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { stateFileError } from '../helpers/stateFileError.js';
import { buildStatus } from '../../src/api/status.js';
import type { Readiness, StateDocument } from '../../src/api/bodies.js';
import { RESOURCES } from '../../src/api/resources.js';
import { desiredStateSchema } from '../../src/state/state.js';
import { diffIsEmpty, diffStates, renderDiff, renderItems, renderStatus, renderTable } from '../../src/cli/render.js';
import { parseStateFile, pathOfField } from '../../src/cli/stateFile.js';
import { kindOf } from '../../src/cli/commands/get.js';

const base = desiredStateSchema.parse({
  initialized: true,
  interfaces: { vpc: 'eth0', ext: 'net1' },
  eips: [{ address: '172.20.0.10', prefixLength: 24 }],
  dnats: [
    { eip: '172.20.0.10', port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 },
    { eip: '172.20.0.10', port: 8081, protocol: 'udp', internalIp: '10.0.1.6', internalPort: 53 },
  ],
  snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24' }],
});

describe('renderTable', () => {
  it('aligns columns two spaces apart without trailing blanks', () => {
    expect(
      renderTable(
        ['A', 'LONGER'],
        [
          ['xyz', '1'],
          ['p', ''],
        ],
      ),
    ).toBe('A    LONGER\nxyz  1\np\n');
  });
});

describe('diffStates / renderDiff', () => {
  it('shows removed, added and changed objects per kind, field by field', () => {
    const next = desiredStateSchema.parse({
      ...base,
      dnats: [
        { eip: '172.20.0.10', port: 8080, protocol: 'tcp', internalIp: '10.0.1.7', internalPort: 80 },
        { eip: '172.20.0.10', port: 9000, protocol: 'tcp', internalIp: '10.0.1.8', internalPort: 90 },
      ],
      snats: [],
    });
    const d = diffStates(base, next);
    expect(diffIsEmpty(d)).toBe(false);
    expect(renderDiff(d)).toBe(
      [
        'snats:',
        '  - 172.20.0.10,10.0.1.0/24  randomFully=false',
        'dnats:',
        '  - 172.20.0.10,8081,udp  internalIp=10.0.1.6 internalPort=53',
        '  + 172.20.0.10,9000,tcp  internalIp=10.0.1.8 internalPort=90',
        '  ~ 172.20.0.10,8080,tcp  internalIp: 10.0.1.6 -> 10.0.1.7',
        'Plan: 1 to add, 2 to remove, 1 to change.',
        '',
      ].join('\n'),
    );
  });

  it('says so when nothing changes, and ignores allocated QoS ids the file leaves out', () => {
    const withQos = desiredStateSchema.parse({
      ...base,
      eipQos: [{ direction: 'egress', ip: '172.20.0.10', priority: 1, rate: '10', burst: '1', classId: 3, handle: 3 }],
    });
    const { classId: _c, handle: _h, ...bare } = withQos.eipQos[0] as Record<string, unknown>;
    const file = { ...withQos, eipQos: [bare] } as unknown as typeof withQos;
    const d = diffStates(withQos, file);
    expect(diffIsEmpty(d)).toBe(true);
    expect(renderDiff(d)).toBe('No changes: the file is the desired state.\n');
  });

  it('caps the lines per kind and counts the rest; gateway changes are listed first', () => {
    const many = desiredStateSchema.parse({
      ...base,
      interfaces: { vpc: 'eth0', ext: 'net2' },
      dnats: Array.from({ length: 5 }, (_, i) => ({ eip: '172.20.0.10', port: 10_000 + i, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 })),
    });
    const text = renderDiff(diffStates(base, many), 2);
    expect(text.split('\n').slice(0, 3)).toEqual(['gateway:', '  ~ interfaces: eth0,net1 -> eth0,net2', 'dnats:']);
    expect(text).toContain('  + … and 3 more\n');
    expect(text).not.toContain('  - … and');
    expect(text).toMatch(/Plan: 5 to add, 2 to remove, 1 to change\.\n$/);
  });
});

describe('renderStatus', () => {
  const readiness: Readiness = { ready: true, interfaces: { present: true, missing: [] }, lastSync: { ok: true, at: '2026-01-01T00:00:00.000Z' }, reasons: [] };
  const doc = (over: Partial<StateDocument> = {}): StateDocument => ({
    desired: base,
    lastApplied: base,
    drift: { last: null, lastRepair: null, repairs: 0 },
    backend: { kind: 'nftables' },
    mode: 'auto',
    generation: 4,
    digest: 'sha256:x',
    ...over,
  });

  it('reports in sync, last sync detail and per-kind counts', () => {
    const s = buildStatus({ ...doc(), digest: buildStatus(doc(), readiness, null).appliedDigest! }, readiness, {
      ok: true,
      at: '2026-01-01T00:00:00.000Z',
      kind: 'partial',
      ms: 3,
    });
    expect(s.inSync).toBe(true);
    const text = renderStatus(s, new Date('2026-01-01T00:00:10.000Z'));
    expect(text).toContain('Ready:       yes\n');
    expect(text).toContain('Backend:     nftables, mode auto\n');
    expect(text).toContain('Applied:     the desired state (digests equal)\n');
    expect(text).toContain('Last sync:   partial, ok, 3 ms, 2026-01-01T00:00:00.000Z (10s ago)\n');
    expect(text).toContain('Drift:       0 repairs; no read-back yet\n');
    expect(text).toMatch(/^dnats\s+2\s+2$/m);
    expect(Object.keys(s.objects)).toEqual(RESOURCES.map((d) => d.path));
  });

  it('reports not ready, a difference, repairs and drift found by a check', () => {
    const notReady: Readiness = { ...readiness, ready: false, reasons: ['last sync failed: boom'] };
    const readBack = {
      at: '2026-01-01T00:00:00.000Z',
      reason: 'periodic',
      changes: { netfilter: 2, shareDnat: 0, link: 1, qos: 0 },
      repaired: true,
      script: 'x',
    };
    const s = buildStatus(doc({ lastApplied: { ...base, dnats: [] }, drift: { last: readBack, lastRepair: readBack, repairs: 1 } }), notReady, null, {
      at: '2026-01-01T00:00:05.000Z',
      changes: { netfilter: 1, shareDnat: 0, link: 0, qos: 0 },
      drifted: true,
      script: 'add element',
    });
    expect(s.inSync).toBe(false);
    expect(s.drift.last).not.toHaveProperty('script');
    const text = renderStatus(s, new Date('2026-01-01T00:00:10.000Z'));
    expect(text).toContain('Ready:       no (last sync failed: boom)\n');
    expect(text).toContain('Applied:     differs from the desired state\n');
    expect(text).toContain('Drift:       1 repair; last read-back 2026-01-01T00:00:00.000Z (10s ago) (periodic): repaired netfilter 2, link 1\n');
    expect(text).toContain('Drift now:   YES: 1 change(s) to repair (netfilter 1)');
    expect(text).toMatch(/^dnats\s+2\s+0\s+\*$/m);
    expect(s.warnings).toEqual([]);
    expect(text).not.toContain('Warnings:');
  });

  it('warns of a subnet route to the default that the external default owns (held, not installed)', () => {
    const desired = {
      ...base,
      defaultRoutes: { v4: '172.20.0.1' },
      routes: [
        { cidr: '0.0.0.0/0', nexthop: '10.0.1.254' },
        { cidr: '::/0', nexthop: 'fe80::1' },
      ],
    };
    const s = buildStatus(doc({ desired }), readiness, null);
    const held =
      'subnet route 0.0.0.0/0 via 10.0.1.254 is held but not installed: the default route via 172.20.0.1 dev net1 (GATEWAY_V4) owns it; ' +
      'subnet-route-del 0.0.0.0/0 drops it, or route 0.0.0.0/1 and 128.0.0.0/1 via 10.0.1.254 instead';
    // The IPv6 one has no external default to yield to: installed, no warning.
    expect(s.warnings).toEqual([held]);
    expect(renderStatus(s, new Date('2026-01-01T00:00:10.000Z'))).toContain(`Warnings:    ${held}\n`);
  });

  it('shows per EIP the share of the SNAT port range its busiest destinations use', () => {
    const snatPorts = [
      {
        eip: '172.20.0.10',
        destinations: 2,
        maxPorts: 10,
        maxShare: 1,
        top: [
          { ip: '172.20.0.100', port: 7002, protocol: 'udp', ports: 10, share: 1 },
          { ip: '172.20.0.100', port: 7003, protocol: 'udp', ports: 1, share: 0.1 },
        ],
      },
    ];
    const s = { ...buildStatus(doc(), readiness, null), snatPorts };
    expect(renderStatus(s, new Date('2026-01-01T00:00:10.000Z'))).toContain(
      'SNAT ports:  172.20.0.10: busiest 100.0 % of the range, 2 destination(s); 172.20.0.100:7002/udp 10 (100.0 %), 172.20.0.100:7003/udp 1 (10.0 %)\n',
    );
  });
});

describe('renderItems / kindOf', () => {
  it("lists the identity then the kind's columns; wide: every other field; kubectl's headers", () => {
    const def = kindOf('share-dnat')!;
    expect(def.path).toBe('share-dnats');
    const text = renderItems(def, [
      {
        id: '172.20.0.10,9000,tcp',
        eip: '172.20.0.10',
        port: 9000,
        protocol: 'tcp',
        protocolText: 'tcp',
        backends: [
          { ip: '10.0.1.6', port: 80 },
          { ip: '10.0.1.7', port: 80 },
        ],
      },
    ]);
    expect(text).toBe('ID                    BACKENDS\n172.20.0.10,9000,tcp  10.0.1.6:80, 10.0.1.7:80\n');
    const wide = renderItems(def, [{ id: '172.20.0.10,9000,tcp', eip: '172.20.0.10', port: 9000, protocol: 'tcp', protocolText: 'TCP', backends: [] }], true);
    expect(wide.split('\n')[0]).toBe('ID                    PROTOCOL-TEXT  BACKENDS');
    const dnats = renderItems(kindOf('dnats')!, [
      { id: '172.20.0.10,8080,tcp', eip: '172.20.0.10', port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 },
    ]);
    expect(dnats).toBe('ID                    INTERNAL-IP  INTERNAL-PORT\n172.20.0.10,8080,tcp  10.0.1.6     80\n');
    expect(renderItems(def, [])).toBe('No Share DNAT objects.\n');
  });

  it('knows every kind by path, state key and singular', () => {
    for (const d of RESOURCES) {
      expect(kindOf(d.path)).toBe(d);
      expect(kindOf(d.stateKey)).toBe(d);
    }
    expect(kindOf('dnat')?.path).toBe('dnats');
    expect(kindOf('eipQos')?.path).toBe('eip-qos');
    expect(kindOf('frob')).toBeUndefined();
  });
});

describe('parseStateFile', () => {
  it('accepts YAML and JSON, bare or wrapped in desired, and counts objects', () => {
    const yaml = 'interfaces: {vpc: eth0, ext: net1}\neips:\n  - address: 172.20.0.10\n    prefixLength: 24\n';
    expect(parseStateFile('s.yaml', yaml).objects).toBe(1);
    const json = JSON.stringify({ desired: base }, null, 2);
    const p = parseStateFile('s.json', json);
    expect(p.objects).toBe(4);
    expect(p.data).toEqual(base);
    expect([...p.present]).toEqual(expect.arrayContaining(['interfaces', 'eips', 'dnats', 'snats']));
  });

  it('names the line and field of a schema error in YAML', () => {
    const text = [
      'desired:',
      '  interfaces: {vpc: eth0, ext: net1}',
      '  dnats:',
      '    - eip: 172.20.0.10',
      '      port: 99999',
      '      protocol: tcp',
      '      internalIp: 10.0.1.6',
      '      internalPort: 80',
      '',
    ].join('\n');
    const e = stateFileError(text);
    expect(e.issues[0]?.line).toBe(5);
    expect(e.issues[0]?.field).toBe('desired.dnats[0].port');
    expect(e.message).toMatch(/^state\.yaml:5: desired\.dnats\[0\]\.port: /);
  });

  it('names the line and field of a schema error in JSON (a missing field: the object lacking it)', () => {
    const text = JSON.stringify(
      { interfaces: { vpc: 'eth0', ext: 'net1' }, eips: [{ address: '172.20.0.10', prefixLength: 24 }, { address: '172.20.0.11' }] },
      null,
      2,
    );
    const e = stateFileError(text, 'state.json');
    expect(e.issues[0]?.field).toBe('eips[1].prefixLength');
    const line = text.split('\n').findIndex((l) => l.includes('172.20.0.11')) + 1;
    // The object `{` opens the line before its first field.
    expect([line - 1, line]).toContain(e.issues[0]?.line);
    expect(e.message).toContain(`state.json:${e.issues[0]?.line}: eips[1].prefixLength:`);
  });

  it('names the line of a duplicate identity and of a syntax error', () => {
    const dup = [
      'interfaces: {vpc: eth0, ext: net1}',
      'fips:',
      '  - {eip: 172.20.0.11, internalIp: 10.0.1.6}',
      '  - {eip: 172.20.0.11, internalIp: 10.0.1.7}',
      '',
    ].join('\n');
    const e = stateFileError(dup);
    expect(e.issues[0]?.line).toBe(4);
    expect(e.issues[0]?.field).toBe('fips[1]');
    expect(e.issues[0]?.reason).toContain('duplicate');
    const yamlSyntax = stateFileError('interfaces:\n  vpc: eth0\n  ext: net1\neips:\n  - address: 1\n   - x: 2\n');
    expect(yamlSyntax.message).toMatch(/^state\.yaml:6: not valid JSON or YAML: .*\(column \d+\)$/);
    // A JSON file without a comma: the line where the next member starts.
    const jsonSyntax = stateFileError('{\n  "interfaces": {"vpc": "eth0",\n  "ext": "net1"\n  "eips": []\n}\n', 'state.json');
    expect(jsonSyntax.message).toMatch(/^state\.json:4: not valid JSON or YAML: /);
    expect(stateFileError('[1, 2]').issues[0]?.reason).toContain('must be an object');
  });

  it('maps API field names to paths', () => {
    expect(pathOfField('desired.dnats[3].port')).toEqual(['desired', 'dnats', 3, 'port']);
    expect(pathOfField('')).toEqual([]);
  });
});

describe('help', () => {
  it("natgw --help is the script's help text unchanged, then the agent's commands", async () => {
    const { HELP } = await import('../../src/engine/legacy.js');
    const { mainHelp, commandHelp, AGENT_COMMANDS } = await import('../../src/cli/commands/help.js');
    const text = await mainHelp();
    expect(text.startsWith(`${HELP}\n\nnatgw's own commands:\n`)).toBe(true);
    for (const c of AGENT_COMMANDS) {
      expect(text).toContain(`  ${c} `);
      expect(commandHelp(c)).toMatch(new RegExp(`^Usage: natgw ${c} `));
    }
  });
});
