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
});
