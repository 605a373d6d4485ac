import { randomBytes } from 'node:crypto';
import type { Executor } from '../../system/exec.js';
import type { QosFeatures } from './render.js';

/**
 * Which optional tc pieces this kernel has (SPEC §2 QoS: "Kernels differ"). Production
 * kernels have fq_codel and the matchall classifier; some hosts lack either, and without
 * modprobe nothing natgw can do loads them. The probe runs on a throwaway device of its
 * own (an IFB, else a dummy), never on a device that carries traffic, and removes it.
 */

export interface ProbeResult {
  readonly features: QosFeatures;
  /** One line for stdout and the log (it says where no throwaway device could be made). */
  readonly summary: string;
}

/** A name no one else uses: natgw-owned prefix + random suffix, within 15 characters. */
export const PROBE_DEVICE_PREFIX = 'ngprobe';
export const probeDeviceName = (): string => `${PROBE_DEVICE_PREFIX}${randomBytes(4).toString('hex')}`;

export async function probeQosFeatures(exec: Executor, name: string): Promise<ProbeResult> {
  const ip = (args: string[]) => exec.run({ file: 'ip', args, timeoutMs: 10_000 });
  const tc = (args: string[]) => exec.run({ file: 'tc', args, timeoutMs: 10_000 });

  const created = (await ip(['link', 'add', name, 'type', 'ifb'])).exitCode === 0 || (await ip(['link', 'add', name, 'type', 'dummy'])).exitCode === 0;
  if (!created) {
    // Both stand-ins always work, so assuming the features absent is the safe side.
    const features = { fqCodel: false, matchall: false };
    return { features, summary: `INFO: QoS: could not create a probe device; assuming no fq_codel and no matchall (${describe(features)})` };
  }
  try {
    await tc(['qdisc', 'add', 'dev', name, 'root', 'handle', '1:', 'htb', 'default', '0x1']);
    await tc(['class', 'add', 'dev', name, 'parent', '1:', 'classid', '1:0x1', 'htb', 'rate', '1mbit']);
    const fqCodel = (await tc(['qdisc', 'add', 'dev', name, 'parent', '1:0x1', 'fq_codel'])).exitCode === 0;
    const matchall = (await tc(['filter', 'add', 'dev', name, 'parent', '1:', 'protocol', 'ip', 'prio', '1', 'matchall', 'flowid', '1:0x1'])).exitCode === 0;
    const features = { fqCodel, matchall };
    return { features, summary: `INFO: QoS kernel probe: ${describe(features)}` };
  } finally {
    await ip(['link', 'del', name]);
  }
}

export function describe(f: QosFeatures): string {
  return [
    f.fqCodel ? 'fq_codel leaves' : 'no fq_codel (classes keep the kernel default leaf)',
    f.matchall ? 'matchall classifier' : 'no matchall (a u32 "match u32 0 0" filter stands in at the same priority)',
  ].join('; ');
}
