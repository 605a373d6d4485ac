import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { DAEMON_NODE_FLAGS } from '../../src/daemon/nodeFlags.js';

describe("the daemon's V8 settings", () => {
  it('the shim starts `serve` with exactly the flags the autostart uses', () => {
    const shim = readFileSync(new URL('../../image/nat-gateway.sh', import.meta.url), 'utf8');
    // The exec line of the shim's `serve` branch, whatever flags it has (none today).
    const line = /^if \[ "\$\{1:-\}" = serve \]; then\n(?:\s*#.*\n)*\s*exec node ((?:--\S+ )*)"\$entry" "\$@"$/m.exec(shim);
    expect(line, 'the shim has an exec line for serve').not.toBeNull();
    expect(line?.[1]?.trim().split(' ').filter(Boolean)).toEqual([...DAEMON_NODE_FLAGS]);
  });

  it('every flag is one node accepts', async () => {
    const { execFileSync } = await import('node:child_process');
    expect(execFileSync(process.execPath, [...DAEMON_NODE_FLAGS, '-e', 'process.stdout.write("ok")'], { encoding: 'utf8' })).toBe('ok');
  });

  it('the run-time flags are ones V8 knows (an unknown one is only a line on stderr)', async () => {
    const { spawnSync } = await import('node:child_process');
    const { DAEMON_RUNTIME_V8_FLAGS } = await import('../../src/daemon/nodeFlags.js');
    const script = `const v8 = require('node:v8'); for (const f of ${JSON.stringify(DAEMON_RUNTIME_V8_FLAGS)}) v8.setFlagsFromString(f); process.stdout.write('ok')`;
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8' });
    expect({ stdout: r.stdout, stderr: r.stderr, status: r.status }).toEqual({ stdout: 'ok', stderr: '', status: 0 });
  });

  describe('bin/heapFlags.cjs: the heap flags keep bounding the heap, and stop failing code caches', () => {
    const heapFlags = new URL('../../bin/heapFlags.cjs', import.meta.url).pathname;
    const probe = (flags: readonly string[], reset: boolean) => {
      const script = [
        reset ? `require(${JSON.stringify(heapFlags)}).unhashHeapFlags();` : '',
        "const v8 = require('node:v8');",
        'const spaces = Object.fromEntries(v8.getHeapSpaceStatistics().map((s) => [s.space_name, s.space_size]));',
        'process.stdout.write(JSON.stringify({ tag: v8.cachedDataVersionTag(), limit: v8.getHeapStatistics().heap_size_limit, newSpace: spaces.new_space }));',
      ].join('\n');
      return import('node:child_process').then(
        ({ execFileSync }) =>
          JSON.parse(execFileSync(process.execPath, [...flags, '-e', script], { encoding: 'utf8' })) as { tag: number; limit: number; newSpace: number },
      );
    };

    it("after the reset the flag hash is plain Node.js's (its built-in code cache is accepted), the heap as the flags set it", async () => {
      const plain = await probe([], false);
      const flagged = await probe(DAEMON_NODE_FLAGS, false);
      const reset = await probe(DAEMON_NODE_FLAGS, true);
      // Without the reset the flags change the hash: what made every start compile the built-ins.
      expect(flagged.tag).not.toBe(plain.tag);
      expect(reset.tag).toBe(plain.tag);
      // The bounds were fixed when the heap was made: the reset leaves them as the flags asked.
      expect(reset.limit).toBe(flagged.limit);
      expect(reset.newSpace).toBe(flagged.newSpace);
      expect(reset.limit).not.toBe(plain.limit);
    });

    it('resets without loading node:v8 and writes nothing on stderr (the binding is deprecated; its warning is silenced)', async () => {
      const { spawnSync } = await import('node:child_process');
      const script = [
        `require(${JSON.stringify(heapFlags)}).unhashHeapFlags();`,
        "const loaded = process.moduleLoadList.includes('NativeModule v8');",
        "process.stdout.write(JSON.stringify({ loaded, tag: require('node:v8').cachedDataVersionTag(), noDeprecation: process.noDeprecation ?? null }));",
      ].join('\n');
      const r = spawnSync(process.execPath, [...DAEMON_NODE_FLAGS, '-e', script], { encoding: 'utf8' });
      expect(r.stderr).toBe('');
      const out = JSON.parse(r.stdout) as { loaded: boolean; tag: number; noDeprecation: boolean | null };
      expect(out.loaded).toBe(false);
      expect(out.tag).toBe((await probe([], false)).tag);
      // The silencing was for the one call: later deprecations still warn.
      expect(out.noDeprecation).toBeNull();
    });

    it('handles every flag the daemon is started with (a new one must be read at heap creation only, or not be here)', async () => {
      const { HEAP_FLAGS, unhashHeapFlags } = (await import(heapFlags)) as { HEAP_FLAGS: string[]; unhashHeapFlags: (argv: string[]) => string[] };
      expect(DAEMON_NODE_FLAGS.every((f) => HEAP_FLAGS.some((h) => f.startsWith(`${h}=`)))).toBe(true);
      expect(unhashHeapFlags([])).toEqual([]);
    });
  });
});
