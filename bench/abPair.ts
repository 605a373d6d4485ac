import { type BackendName, Gateway } from './gateway.js';
import { stateDoc } from './workload.js';

/** The two gateways of an A/B run: another build's and this one's. */
export type AbPair = Record<'other' | 'this', Gateway>;

/**
 * Two gateways filled to `size`, their daemons running: one of another build (`otherGatewayJs`,
 * an older checkout's built dist/bench/gateway.js) and one of this build. The caller cleans both up.
 */
export async function abPair(otherGatewayJs: string, backend: BackendName, size: number): Promise<AbPair> {
  const Other = ((await import(otherGatewayJs)) as { Gateway: typeof Gateway }).Gateway;
  const gws: AbPair = { other: await Other.bare({ backend, resync: '1h' }), this: await Gateway.bare({ backend, resync: '1h' }) };
  try {
    for (const gw of Object.values(gws)) {
      Object.assign(gw.topo.env, { NATGW_BODY_LIMIT: '512mb' });
      await gw.startDaemon();
      await gw.putState(stateDoc(size, false));
      await gw.settleAnnouncements();
    }
  } catch (e) {
    for (const gw of Object.values(gws)) await gw.cleanup();
    throw e;
  }
  return gws;
}
