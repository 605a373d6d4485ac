import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { DAEMON_NODE_FLAGS } from '../../src/daemon/nodeFlags.js';

describe("the daemon's V8 settings", () => {
  it('the shim starts `serve` with exactly the flags the autostart uses', () => {
    const shim = readFileSync(new URL('../../image/nat-gateway.sh', import.meta.url), 'utf8');
    const line = /^\s*exec node ((?:--\S+ )+)"\$entry" "\$@"$/m.exec(shim);
    expect(line, 'the shim has an exec line with node flags for serve').not.toBeNull();
    expect(line?.[1]?.trim().split(' ')).toEqual([...DAEMON_NODE_FLAGS]);
  });

  it('every flag is one node accepts', async () => {
    const { execFileSync } = await import('node:child_process');
    expect(execFileSync(process.execPath, [...DAEMON_NODE_FLAGS, '-e', 'process.stdout.write("ok")'], { encoding: 'utf8' })).toBe('ok');
  });
});
