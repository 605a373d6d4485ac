import type { StatusDocument } from '../../api/bodies.js';
import { requestJson } from '../client.js';
import { renderStatus } from '../render.js';
import { CONNECTION_OPTIONS, OUTPUT_OPTIONS, outputOf, parseOptions, targetOf, type Io } from './common.js';
import { commandHelp } from './help.js';

/** Exit status of `natgw status --check` when the kernel differs from what the daemon applied. */
export const DRIFT_EXIT = 4;

/** `natgw status [--check] [-o json]`: exit 0 when the gateway is ready (and, with --check, holds its state), 3 when not ready, 4 on drift. */
export async function status(args: readonly string[], io: Io): Promise<number> {
  const { values } = parseOptions('status', args, {
    ...CONNECTION_OPTIONS,
    output: OUTPUT_OPTIONS.output,
    json: OUTPUT_OPTIONS.json,
    check: { type: 'boolean' },
  });
  if (values.help) {
    io.out(commandHelp('status'));
    return 0;
  }
  const json = outputOf('status', values, ['text', 'json'], 'text') === 'json';
  const target = await targetOf(values, io.env);
  const doc = await requestJson<StatusDocument>(target, 'GET', values.check ? '/v1/status?check=true' : '/v1/status');
  io.out(json ? `${JSON.stringify(doc, null, 2)}\n` : renderStatus(doc));
  if (!doc.ready) return 3;
  return values.check && doc.drift.check?.drifted ? DRIFT_EXIT : 0;
}
