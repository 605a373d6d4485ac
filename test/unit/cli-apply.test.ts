/**
 * `natgw apply`'s strict file check (every error at once, unknown fields named with their
 * line), its kubectl-like merge (create, configure, leave or --prune the rest) and its lines;
 * the usage errors as one line; `describe`'s text; `--version`'s sources.
 */
import { describe, expect, it } from 'vitest';
import { stateFileError } from '../helpers/stateFileError.js';
import { desiredStateSchema } from '../../src/state/state.js';
import { closestField, parseStateFile, unknownFields } from '../../src/cli/stateFile.js';
import { mergeState, renderResults } from '../../src/cli/merge.js';
import { headerOf, labelOf, renderDescribe } from '../../src/cli/render.js';
import { kindOf } from '../../src/cli/commands/get.js';
import { outputOf, parseOptions } from '../../src/cli/commands/common.js';
import { resolveVersion } from '../../src/cli/version.js';
import { CliError } from '../../src/cli/client.js';

const current = desiredStateSchema.parse({
  initialized: true,
  interfaces: { vpc: 'eth0', ext: 'net1' },
  eips: [{ address: '172.20.0.10', prefixLength: 24 }],
  dnats: [
    { eip: '172.20.0.10', port: 8080, protocol: 'tcp', internalIp: '10.0.1.6', internalPort: 80 },
    { eip: '172.20.0.10', port: 8081, protocol: 'udp', internalIp: '10.0.1.6', internalPort: 53 },
  ],
  snats: [{ eip: '172.20.0.10', cidr: '10.0.1.0/24' }],
  eipQos: [{ direction: 'egress', ip: '172.20.0.10', priority: 1, rate: '10', burst: '1', classId: 7, handle: 7 }],
});

describe('strict state file', () => {
  it('reports every error at once, unknown fields with their line and a suggestion', () => {
    const text = [
      'desired:', // 1
      '  interfaces: {vpc: eth0, ext: net1}', // 2
      '  eips:', // 3
      '    - address: 172.20.0.10', // 4
      '      prefixLenght: 24', // 5
      '  dnats:', // 6
      '    - eip: 172.20.0.10', // 7
      '      port: 99999', // 8
      '      protocol: tcp', // 9
      '      internalIp: 10.0.1.6', // 10
      '      internalPort: 80', // 11
      '      colour: blue', // 12
      '  fipz: []', // 13
      'lastApplied: null', // 14
      'extra: 1', // 15
      '',
    ].join('\n');
    const e = stateFileError(text);
    const byField = Object.fromEntries(e.issues.map((i) => [i.field, i]));
    expect(byField['desired.eips[0].prefixLenght']).toEqual({
      line: 5,
      field: 'desired.eips[0].prefixLenght',
      reason: 'unknown field (did you mean prefixLength?)',
    });
    expect(byField['desired.eips[0].prefixLength']?.line).toBe(4);
    expect(byField['desired.dnats[0].port']?.line).toBe(8);
    expect(byField['desired.dnats[0].colour']).toMatchObject({ line: 12, reason: 'unknown field' });
    expect(byField['desired.fipz']).toMatchObject({ line: 13, reason: 'unknown field (did you mean fips?)' });
    expect(byField.extra).toMatchObject({ line: 15 });
    expect(byField.lastApplied).toBeUndefined();
    // In line order, one per line after a header.
    expect(e.issues.map((i) => i.line)).toEqual([...e.issues.map((i) => i.line)].sort((a, b) => (a ?? 0) - (b ?? 0)));
    const lines = e.message.split('\n');
    expect(lines[0]).toBe(`state.yaml: ${e.issues.length} errors, nothing was applied:`);
    expect(lines).toContain('state.yaml:5: desired.eips[0].prefixLenght: unknown field (did you mean prefixLength?)');
    expect(lines.slice(1).every((l) => /^state\.yaml:\d+: \S+: /.test(l))).toBe(true);
  });

  it('names an unknown field in JSON at its own line; a duplicate identity is reported beside it', () => {
    const text = JSON.stringify({ interfaces: { vpc: 'eth0', ext: 'net1' }, routes: [{ cidr: '10.0.2.0/24', nexthop: '10.0.1.254', metric: 5 }] }, null, 2);
    const e = stateFileError(text, 's.json');
    expect(e.issues).toEqual([{ line: text.split('\n').findIndex((l) => l.includes('"metric"')) + 1, field: 'routes[0].metric', reason: 'unknown field' }]);
    expect(e.message).toBe(`s.json:${e.issues[0]?.line}: routes[0].metric: unknown field`);
    const both = stateFileError(
      ['routes:', '  - {cidr: 10.0.2.0/24, nexthop: 10.0.1.254, metric: 5}', '  - {cidr: 10.0.2.0/24, nexthop: 10.0.1.253}', ''].join('\n'),
    );
    expect(both.issues.map((i) => [i.line, i.field])).toEqual([
      [2, 'routes[0].metric'],
      [3, 'routes[1]'],
    ]);
    expect(both.issues[1]?.reason).toContain('duplicate Subnet route identity');
  });

  it('accepts a file that lists only some kinds, and leaves out the interfaces', () => {
    const p = parseStateFile('s.yaml', 'dnats:\n  - {eip: 172.20.0.10, port: 9000, protocol: tcp, internalIp: 10.0.1.7, internalPort: 90}\n');
    expect([...p.present]).toEqual(['dnats']);
    expect(p.objects).toBe(1);
  });

  it('walks zod schemas: objects, arrays, wrappers; passes what it cannot judge', () => {
    const unknown = unknownFields(desiredStateSchema, { eips: [{ address: 'x', nope: 1 }], interfaces: { vpc: 'a', ext: 'b', mtu: 1 } });
    expect(unknown.map((u) => u.path)).toEqual([
      ['eips', 0, 'nope'],
      ['interfaces', 'mtu'],
    ]);
    expect(unknown[1]?.known).toContain('ext');
    expect(unknownFields(desiredStateSchema, 'not an object')).toEqual([]);
    expect(closestField('INTERNALIP', ['internalIp', 'eip'])).toBe('internalIp');
    expect(closestField('zzz', ['internalIp', 'eip'])).toBeUndefined();
  });
});

describe('apply merge', () => {
  const file = (text: string) => parseStateFile('f.yaml', text);

  it('creates and configures what the file lists, keeps the rest, and says so per object', () => {
    const m = mergeState(
      current,
      file(
        [
          'dnats:',
          '  - {eip: 172.20.0.10, port: 8080, protocol: tcp, internalIp: 10.0.1.7, internalPort: 80}',
          '  - {eip: 172.20.0.10, port: 8081, protocol: udp, internalIp: 10.0.1.6, internalPort: 53}',
          '  - {eip: 172.20.0.10, port: 9000, protocol: tcp, internalIp: 10.0.1.8, internalPort: 90}',
          'eipQos:',
          '  - {direction: egress, ip: 172.20.0.10, priority: 1, rate: "20", burst: "1"}',
          '',
        ].join('\n'),
      ),
      false,
    );
    expect(m.results).toEqual([
      { kind: 'dnat', id: '172.20.0.10,8080,tcp', action: 'configured' },
      { kind: 'dnat', id: '172.20.0.10,8081,udp', action: 'unchanged' },
      { kind: 'dnat', id: '172.20.0.10,9000,tcp', action: 'created' },
      { kind: 'eip-qos', id: 'egress,172.20.0.10', action: 'configured' },
    ]);
    expect(m.next.snats).toEqual(current.snats);
    expect(m.next.eips).toEqual(current.eips);
    expect(m.next.dnats.map((d) => d.internalIp)).toEqual(['10.0.1.7', '10.0.1.6', '10.0.1.8']);
    // The allocated class id is kept where the file leaves it out.
    expect(m.next.eipQos[0]).toMatchObject({ rate: '20', classId: 7, handle: 7 });
    expect(m.next.interfaces).toEqual(current.interfaces);
    expect(renderResults(m.results, false)).toBe(
      [
        'dnat/172.20.0.10,8080,tcp configured',
        'dnat/172.20.0.10,8081,udp unchanged',
        'dnat/172.20.0.10,9000,tcp created',
        'eip-qos/egress,172.20.0.10 configured',
        '',
      ].join('\n'),
    );
  });

  it('removes what the file does not list only with --prune', () => {
    const f = file('interfaces: {vpc: eth0, ext: net1}\ninitialized: true\neips:\n  - {address: 172.20.0.10, prefixLength: 24}\n');
    const kept = mergeState(current, f, false);
    expect(kept.next.dnats).toHaveLength(2);
    expect(kept.results).toEqual([
      { kind: 'gateway', id: '', action: 'unchanged' },
      { kind: 'eip', id: '172.20.0.10', action: 'unchanged' },
    ]);
    const pruned = mergeState(current, f, true);
    expect(pruned.next.dnats).toEqual([]);
    expect(pruned.next.snats).toEqual([]);
    expect(pruned.results.filter((r) => r.action === 'pruned').map((r) => `${r.kind}/${r.id}`)).toEqual([
      'snat/172.20.0.10,10.0.1.0/24',
      'dnat/172.20.0.10,8080,tcp',
      'dnat/172.20.0.10,8081,udp',
      'eip-qos/egress,172.20.0.10',
    ]);
    expect(renderResults(pruned.results, true)).toContain('dnat/172.20.0.10,8080,tcp pruned (dry run)\n');
  });

  it('says when the gateway fields change, and caps the lines per kind and action', () => {
    const m = mergeState(current, file('interfaces: {vpc: eth0, ext: net2}\n'), false);
    expect(m.results).toEqual([{ kind: 'gateway', id: '', action: 'configured' }]);
    expect(m.next.interfaces.ext).toBe('net2');
    expect(renderResults(m.results, false)).toBe('gateway configured\n');
    const many = Array.from({ length: 5 }, (_, i) => ({ kind: 'dnat', id: String(i), action: 'created' as const }));
    expect(renderResults(many, false, 2)).toBe('dnat/0 created\ndnat/1 created\ndnat: … and 3 more created\n');
  });
});

describe('rendering and usage errors', () => {
  it("writes kubectl's headers and describe's labels", () => {
    expect(headerOf('internalIp')).toBe('INTERNAL-IP');
    expect(headerOf('prefixLength')).toBe('PREFIX-LENGTH');
    expect(labelOf('internalIp')).toBe('Internal IP');
    expect(labelOf('matchDirection')).toBe('Match direction');
    const text = renderDescribe(kindOf('fip')!, { id: '172.20.0.11', eip: '172.20.0.11', internalIp: '10.0.1.7' }, true);
    expect(text).toBe(
      [
        'Kind:         FIP',
        'ID:           172.20.0.11',
        'EIP:          172.20.0.11',
        'Internal IP:  10.0.1.7',
        'Applied:      yes (as the daemon last applied it)',
        '',
      ].join('\n'),
    );
  });

  it("turns parseArgs' faults into one line in kubectl's words", () => {
    const err = (args: string[], allowPositionals = false) => {
      try {
        parseOptions('apply', args, { filename: { type: 'string', short: 'f' }, json: { type: 'boolean' } }, allowPositionals);
      } catch (e) {
        expect((e as CliError).exitCode).toBe(2);
        return (e as Error).message.replace(/^natgw apply: (.*) \(see 'natgw apply --help'\)$/, '$1');
      }
      throw new Error('accepted');
    };
    expect(err(['-o', 'json'])).toBe('unknown flag -o');
    expect(err(['--frob'])).toBe('unknown flag --frob');
    expect(err(['-f'])).toBe('flag --filename needs a value');
    expect(err(['--json=yes'])).toBe('flag --json takes no value');
    expect(err(['x'])).toBe('unexpected argument x');
    expect(() => parseOptions('apply', ['x', '-f', 'a'], { filename: { type: 'string', short: 'f' } }, true)).not.toThrow();
  });

  it('knows -o and its older spellings, and refuses two formats or an unknown one', () => {
    expect(outputOf('get', { output: 'wide' }, ['table', 'wide', 'json'], 'table')).toBe('wide');
    expect(outputOf('get', { json: true }, ['table', 'json'], 'table')).toBe('json');
    expect(outputOf('get', { output: 'json', json: true }, ['table', 'json'], 'table')).toBe('json');
    expect(() => outputOf('get', { output: 'yaml', json: true }, ['table', 'json', 'yaml'], 'table')).toThrow(/one output format at a time/);
    expect(() => outputOf('get', { output: 'xml' }, ['table', 'json'], 'table')).toThrow(CliError);
  });
});

describe('natgw --version', () => {
  it("takes the build's record, then the environment's revision, else unknown", () => {
    expect(resolveVersion({ version: '1.2.3', revision: 'abc' }, { version: '0.0.1' }, { NATGW_REVISION: 'env' })).toEqual({
      version: '1.2.3',
      revision: 'abc',
    });
    expect(resolveVersion({ version: '1.2.3', revision: 'unknown' }, undefined, { NATGW_REVISION: 'def' })).toEqual({ version: '1.2.3', revision: 'def' });
    expect(resolveVersion(undefined, { version: '0.1.0' }, {})).toEqual({ version: '0.1.0', revision: 'unknown' });
  });
});
