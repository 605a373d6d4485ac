import { describe, expect, it } from 'vitest';
import { ValidationError } from '../../src/model/errors.js';
import { eipQosSchema, gwQosSchema, gwQosKey, canonicalDecimal } from '../../src/model/qos.js';
import { parseEipQosAdd, parseEipQosDel, parseGwQos, parseGwQosDel } from '../../src/model/qosLegacy.js';

/** The one-line message a rejection carries (and proof that it is a ValidationError). */
function rejection(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ValidationError);
    const msg = (e as ValidationError).message;
    expect(msg).not.toContain('\n');
    expect((e as ValidationError).stream).toBe('stdout');
    return msg;
  }
  throw new Error('expected a ValidationError');
}

describe('parseEipQosAdd', () => {
  it('parses ip,priority,rate,burst', () => {
    expect(parseEipQosAdd('172.21.0.23,1,10,1', 'egress')).toEqual({ direction: 'egress', ip: '172.21.0.23', priority: 1, rate: '10', burst: '1' });
    expect(parseEipQosAdd('172.21.0.23,2,0.5,1.5', 'ingress')).toEqual({ direction: 'ingress', ip: '172.21.0.23', priority: 2, rate: '0.5', burst: '1.5' });
  });

  it('keeps decimals in canonical form and tolerates a /len on the address', () => {
    expect(parseEipQosAdd('1.2.3.4/32,0,010.50,.5', 'egress')).toMatchObject({ ip: '1.2.3.4', priority: 0, rate: '10.5', burst: '0.5' });
    expect(canonicalDecimal('000.000100')).toBe('0.0001');
    expect(canonicalDecimal('10.0')).toBe('10');
  });

  it('says exactly which field is wrong', () => {
    expect(rejection(() => parseEipQosAdd('1.2.3.4,1,x,1', 'egress'))).toBe(
      "Error: invalid eip-egress-qos rule '1.2.3.4,1,x,1': rate 'x' is not a positive decimal",
    );
    expect(rejection(() => parseEipQosAdd('1.2.3.4,1,1,0', 'ingress'))).toBe(
      "Error: invalid eip-ingress-qos rule '1.2.3.4,1,1,0': burst '0' is not a positive decimal",
    );
  });

  it.each([
    ['1.2.3.4,1,10', /expected 4 comma-separated fields/],
    ['1.2.3.4,1,10,1,5', /expected 4 comma-separated fields/],
    ['1.2.3,1,10,1', /ip '1.2.3' is not a dotted IPv4 address/],
    ['1.2.3.4/33,1,10,1', /ip '1.2.3.4\/33'/],
    ['fd00::1,1,10,1', /ip 'fd00::1'/],
    ['1.2.3.4,x,10,1', /priority 'x' is not an integer/],
    ['1.2.3.4,1.5,10,1', /priority '1.5' is not an integer/],
    ['1.2.3.4,-1,10,1', /priority '-1' is not an integer/],
    ['1.2.3.4,65536,10,1', /priority '65536' is not an integer/],
    ['1.2.3.4,,10,1', /priority '' is not an integer/],
    ['1.2.3.4,1,0,1', /rate '0' is not a positive decimal/],
    ['1.2.3.4,1,-5,1', /rate '-5' is not a positive decimal/],
    ['1.2.3.4,1,1e3,1', /rate '1e3' is not a positive decimal/],
    ['1.2.3.4,1,10mbit,1', /rate '10mbit' is not a positive decimal/],
    ['1.2.3.4,1,,1', /rate '' is not a positive decimal/],
    ['1.2.3.4,1,99999999,1', /rate '99999999' exceeds/],
    // tc programs whole bytes per second and refuses 0 ("rate" is required): 8 bit/s is the least.
    ['1.2.3.4,1,0.000001,1', /rate '0.000001' is below 0.000008 Mbit\/s/],
    ['1.2.3.4,1,0.0000079,1', /rate '0.0000079' is below 0.000008 Mbit\/s/],
    ['1.2.3.4,1,10,abc', /burst 'abc' is not a positive decimal/],
    ['1.2.3.4,1,10,5000', /burst '5000' exceeds/],
    ['1.2.3.4,1,10,0.0000001', /burst '0.0000001' is less than one byte/],
    ['1.2.3.4,1,10,1;reboot', /burst '1;reboot'/],
  ])('rejects %s', (rule, why) => {
    expect(rejection(() => parseEipQosAdd(rule, 'egress'))).toMatch(why);
  });
});

describe('parseEipQosDel', () => {
  it('takes the first field and tolerates a /len suffix', () => {
    expect(parseEipQosDel('1.2.3.4', 'egress')).toBe('1.2.3.4');
    expect(parseEipQosDel('1.2.3.4/32', 'ingress')).toBe('1.2.3.4');
    expect(parseEipQosDel('1.2.3.4,1,10,1', 'egress')).toBe('1.2.3.4');
  });
  it('rejects what is not an address', () => {
    expect(rejection(() => parseEipQosDel('x', 'ingress'))).toBe("Error: invalid eip-ingress-qos rule 'x': ip 'x' is not a dotted IPv4 address");
    expect(rejection(() => parseEipQosDel('', 'egress'))).toMatch(/^Error: invalid eip-egress-qos rule '': ip ''/);
  });
});

describe('parseGwQos', () => {
  it('parses a u32 rule, canonicalising the cidr', () => {
    expect(parseGwQos('egress,net1,2,u32,ip,dst,192.168.1.1/32,25,25')).toEqual({
      direction: 'egress',
      dev: 'net1',
      priority: 2,
      classifier: 'u32',
      matchType: 'ip',
      matchDirection: 'dst',
      cidr: '192.168.1.1/32',
      rate: '25',
      burst: '25',
    });
    expect(parseGwQos('ingress,net1,2,u32,ip,src,10.0.0.5/24,1,1').cidr).toBe('10.0.0.0/24');
    expect(parseGwQos('ingress,net1,2,u32,ip,src,10.0.0.5,1,1').cidr).toBe('10.0.0.5/32');
  });

  it('parses a matchall rule with fields 5-7 empty (split keeps empty fields)', () => {
    expect(parseGwQos('egress,net1,3,matchall,,,,30,1.5')).toEqual({
      direction: 'egress',
      dev: 'net1',
      priority: 3,
      classifier: 'matchall',
      matchType: '',
      matchDirection: '',
      cidr: '',
      rate: '30',
      burst: '1.5',
    });
  });

  it.each([
    ['egress,net1,3,matchall,,,30,1', /expected 9 comma-separated fields/],
    ['both,net1,3,matchall,,,,30,1', /unknown direction 'both'/],
    ['egress,,3,matchall,,,,30,1', /dev '' is not a Linux interface name/],
    ['egress,net1;x,3,matchall,,,,30,1', /dev 'net1;x' is not a Linux interface name/],
    ['egress,abcdefghijklmnop,3,matchall,,,,30,1', /dev 'abcdefghijklmnop' is not a Linux interface name/],
    ['ingress,abcdefghijkl,3,matchall,,,,30,1', /too long for its IFB device 'ifb-abcdefghijkl'/],
    ['egress,net1,three,matchall,,,,30,1', /priority 'three' is not an integer/],
    ['egress,net1,3,flower,,,,30,1', /unknown classifier 'flower'/],
    ['egress,net1,3,u32,ipv6,dst,10.0.0.0/8,30,1', /match type 'ipv6' is not ip/],
    ['egress,net1,3,u32,ip,both,10.0.0.0/8,30,1', /match direction 'both' is not src or dst/],
    ['egress,net1,3,u32,ip,dst,10.0.0.0/33,30,1', /cidr '10.0.0.0\/33' is not an IPv4 CIDR/],
    ['egress,net1,3,u32,ip,dst,,30,1', /cidr '' is not an IPv4 CIDR/],
    ['egress,net1,3,matchall,ip,,,30,1', /matchall takes no match type/],
    ['egress,net1,3,matchall,,,10.0.0.0/8,30,1', /matchall takes no match type/],
    ['egress,net1,3,matchall,,,,x,1', /rate 'x' is not a positive decimal/],
    ['egress,net1,3,matchall,,,,30,', /burst '' is not a positive decimal/],
  ])('rejects %s', (rule, why) => {
    const msg = rejection(() => parseGwQos(rule));
    expect(msg.startsWith(`Error: invalid qos rule '${rule}': `)).toBe(true);
    expect(msg).toMatch(why);
  });

  it('accepts a 12-character device for egress (no IFB needed)', () => {
    expect(parseGwQos('egress,abcdefghijkl,3,matchall,,,,30,1').dev).toBe('abcdefghijkl');
  });
});

describe('parseGwQosDel', () => {
  it('accepts the nine fields of qos-add or the seven identity fields', () => {
    const nine = parseGwQosDel('egress,net1,2,u32,ip,dst,192.168.1.0/24,25,25');
    const seven = parseGwQosDel('egress,net1,2,u32,ip,dst,192.168.1.0/24');
    expect(nine).toEqual(seven);
    expect(gwQosKey(nine)).toBe(gwQosKey(parseGwQos('egress,net1,2,u32,ip,dst,192.168.1.0/24,1,1')));
    // rate and burst play no part in a delete
    expect(() => parseGwQosDel('egress,net1,3,matchall,,,,whatever,x')).not.toThrow();
  });
  it('still checks the identity fields', () => {
    expect(rejection(() => parseGwQosDel('egress,net1,2,u32,ip,dst'))).toMatch(/expected 7 or 9/);
    expect(rejection(() => parseGwQosDel('egress,net1,2,u32,ip,up,10.0.0.0/8'))).toMatch(/match direction 'up'/);
  });
});

describe('schemas (the API side of the same rules)', () => {
  it('canonicalises rates and cidrs and checks classifier fields', () => {
    expect(eipQosSchema.parse({ direction: 'egress', ip: '1.2.3.4', priority: 1, rate: '10.0', burst: '01' })).toMatchObject({ rate: '10', burst: '1' });
    const gw = gwQosSchema.parse({
      direction: 'egress',
      dev: 'net1',
      priority: 2,
      classifier: 'u32',
      matchType: 'ip',
      matchDirection: 'src',
      cidr: '10.1.2.3/16',
      rate: '1',
      burst: '1',
    });
    expect(gw.cidr).toBe('10.1.0.0/16');
    const bad = gwQosSchema.safeParse({
      direction: 'egress',
      dev: 'net1',
      priority: 2,
      classifier: 'matchall',
      matchType: '',
      matchDirection: '',
      cidr: '10.0.0.0/8',
      rate: '1',
      burst: '1',
    });
    expect(bad.success).toBe(false);
    expect(eipQosSchema.safeParse({ direction: 'egress', ip: '1.2.3.4', priority: 1, rate: '0', burst: '1' }).success).toBe(false);
    expect(eipQosSchema.safeParse({ direction: 'egress', ip: '1.2.3.4', priority: 1, rate: '1', burst: '1', classId: 0x10000 }).success).toBe(false);
  });
});

describe('the least rate tc can express', () => {
  it('is one byte per second, for the command line and the API schema alike', () => {
    expect(parseEipQosAdd('1.2.3.4,1,0.000008,1', 'egress').rate).toBe('0.000008');
    expect(parseGwQos('egress,net1,1,matchall,,,,0.000008,1').rate).toBe('0.000008');
    expect(rejection(() => parseGwQos('egress,net1,1,matchall,,,,0.000001,1'))).toMatch(/rate '0.000001' is below 0.000008 Mbit\/s/);
    expect(eipQosSchema.safeParse({ direction: 'egress', ip: '1.2.3.4', priority: 1, rate: '0.000008', burst: '1' }).success).toBe(true);
    expect(eipQosSchema.safeParse({ direction: 'egress', ip: '1.2.3.4', priority: 1, rate: '0.000001', burst: '1' }).success).toBe(false);
  });
});
