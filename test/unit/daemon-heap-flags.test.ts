import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { DAEMON_NODE_FLAGS } from '../../src/cli/forward.js';

describe("the daemon's heap flags", () => {
  it('the shim starts `serve` with exactly the flags the autostart uses', () => {
    const shim = readFileSync(new URL('../../image/nat-gateway.sh', import.meta.url), 'utf8');
    // The exec line of the shim's `serve` branch, whatever flags it has.
    const line = /^if \[ "\$\{1:-\}" = serve \]; then\n(?:\s*#.*\n)*\s*exec node ((?:--\S+ )*)"\$entry" "\$@"$/m.exec(shim);
    expect(line, 'the shim has an exec line for serve').not.toBeNull();
    expect(line?.[1]?.trim().split(' ').filter(Boolean)).toEqual([...DAEMON_NODE_FLAGS]);
  });

  it('every flag is one node accepts', () => {
    expect(execFileSync(process.execPath, [...DAEMON_NODE_FLAGS, '-e', 'process.stdout.write("ok")'], { encoding: 'utf8' })).toBe('ok');
  });
});
