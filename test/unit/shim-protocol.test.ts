/**
 * The shim's loopback protocol (src/daemon/shimListener.ts), its pure parts: a request is
 * parsed only when whole and only with the right secret, within POST /v1/legacy's limits; an
 * answer carries exact byte counts, escaped only where a NUL would be lost in bash.
 */
import { describe, expect, it } from 'vitest';
import { parseShimRequest, renderShimAnswer, shimFieldCount } from '../../src/daemon/shimListener.js';

const SECRET = 'ab'.repeat(32);
const req = (fields: (string | Buffer)[], secret = SECRET, n = fields.length) =>
  Buffer.concat([Buffer.from(`natgw-shim/1 ${secret} ${n}\n`), ...fields.flatMap((f) => [Buffer.from(f), Buffer.from([0])])]);

describe('shim request', () => {
  it('parses the command and its rules as sent, empty ones and invalid UTF-8 included', () => {
    expect(parseShimRequest(req(['dnat-add', '', 'a b\n', Buffer.from([0x31, 0xff])]), SECRET)).toEqual({
      command: 'dnat-add',
      rules: ['', 'a b\n', '1\ufffd'],
    });
  });

  it('waits for the rest of a request cut anywhere', () => {
    const whole = req(['snat-add', '172.20.0.10,10.0.1.0/24']);
    for (let cut = 0; cut < whole.length; cut++) expect(parseShimRequest(whole.subarray(0, cut), SECRET)).toBeUndefined();
    expect(parseShimRequest(whole, SECRET)?.command).toBe('snat-add');
  });

  it('refuses a wrong secret, a foreign request line, stray bytes and requests beyond the limits', () => {
    expect(() => shimFieldCount(req(['x'], 'cd'.repeat(32)), SECRET)).toThrow('wrong secret');
    expect(() => shimFieldCount(Buffer.from('POST /v1/legacy HTTP/1.1\r\n'), SECRET)).toThrow('malformed request line');
    expect(() => shimFieldCount(Buffer.alloc(200, 0x61), SECRET)).toThrow('no request line');
    expect(() => shimFieldCount(req([], SECRET, 0), SECRET)).toThrow('bad field count');
    expect(() => parseShimRequest(Buffer.concat([req(['x']), Buffer.from('y')]), SECRET)).toThrow('bytes after the last field');
    expect(() => parseShimRequest(req(['x'.repeat(257)]), SECRET)).toThrow('limits');
    expect(() => parseShimRequest(req(['dnat-add', 'x'.repeat(65_537)]), SECRET)).toThrow('limits');
  });
});

describe('shim answer', () => {
  const parse = (b: Buffer) => {
    const nl = b.indexOf(0x0a);
    const [proto, secret, status, nout, nerr, enc] = b.subarray(0, nl).toString('latin1').split(' ');
    const body = b.subarray(nl + 1);
    return {
      proto,
      secret,
      status,
      enc,
      stdout: body.subarray(0, Number(nout)),
      stderr: body.subarray(Number(nout)),
      rest: body.length - Number(nout) - Number(nerr),
    };
  };

  it('carries stdout and stderr raw, counted in bytes', () => {
    const a = parse(renderShimAnswer(SECRET, { status: 1, stdout: 'é € no newline', stderr: 'Warning: x\n' }));
    expect(a).toMatchObject({ proto: 'natgw-shim/1', secret: SECRET, status: '1', enc: 'raw', rest: 0 });
    expect(a.stdout.toString('utf8')).toBe('é € no newline');
    expect(a.stderr.toString('utf8')).toBe('Warning: x\n');
  });

  it('escapes both streams for printf %b where either holds a NUL', () => {
    const a = parse(renderShimAnswer(SECRET, { status: 0, stdout: 'a\0\\b é', stderr: '' }));
    expect(a.enc).toBe('esc');
    expect(a.stdout.toString('latin1')).toBe('a\\x00\\x5cb\\x20\\xc3\\xa9');
    expect(a.rest).toBe(0);
  });
});
