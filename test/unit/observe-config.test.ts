/** The flow-log and conntrack keys: defaults, values, bounds with messages naming the key. */
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.js';

const load = (env: Record<string, string>) => loadConfig({ NATGW_ENV_FILE: '/nonexistent/natgw-observe.env', ...env });

describe('flow-log and conntrack configuration', () => {
  it('defaults: flow logs off, connection metrics on, sysctls untouched', async () => {
    const c = await load({});
    expect(c).toMatchObject({
      flowLog: 'off',
      flowLogFile: '/var/log/natgw/flows.log',
      flowLogMaxSize: 64 * 1024 ** 2,
      flowLogRate: 1000,
      flowLogBurst: 2000,
      conntrackMetrics: true,
      conntrackSysctls: false,
    });
  });

  it('reads every key', async () => {
    const c = await load({
      NATGW_FLOW_LOG: 'file',
      NATGW_FLOW_LOG_FILE: '/tmp/f.log',
      NATGW_FLOW_LOG_MAX_SIZE: '1mb',
      NATGW_FLOW_LOG_RATE: '5',
      NATGW_FLOW_LOG_BURST: '7',
      NATGW_CONNTRACK_METRICS: 'false',
      NATGW_CONNTRACK_SYSCTLS: 'yes',
    });
    expect(c).toMatchObject({
      flowLog: 'file',
      flowLogFile: '/tmp/f.log',
      flowLogMaxSize: 1024 ** 2,
      flowLogRate: 5,
      flowLogBurst: 7,
      conntrackMetrics: false,
      conntrackSysctls: true,
    });
  });

  it.each([
    ['NATGW_FLOW_LOG', 'syslog'],
    ['NATGW_FLOW_LOG_MAX_SIZE', '1kb'],
    ['NATGW_FLOW_LOG_RATE', '0'],
    ['NATGW_FLOW_LOG_RATE', '1.5'],
    ['NATGW_FLOW_LOG_BURST', '2000000'],
    ['NATGW_FLOW_LOG_BURST', 'lots'],
  ])('refuses %s=%s, naming the key', async (key, value) => {
    const e = await load({ [key]: value }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ConfigError);
    expect((e as Error).message).toContain(key);
  });
});
