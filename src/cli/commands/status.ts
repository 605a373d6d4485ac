import type { StatusDocument } from '../../api/status.js';
import { requestJson } from '../client.js';
import { renderStatus } from '../render.js';
import { CONNECTION_OPTIONS, parseOptions, targetOf, type Io } from './common.js';
import { commandHelp } from './help.js';

/** `natgw status [--check] [--json]`: exit 0 when the gateway is ready, 3 when it is not. */
export async function status(args: readonly string[], io: Io): Promise<number> {
  const { values } = parseOptions('status', args, { ...CONNECTION_OPTIONS, json: { type: 'boolean' }, check: { type: 'boolean' } });
  if (values.help) {
    io.out(commandHelp('status'));
    return 0;
  }
  const target = await targetOf(values, io.env);
  const doc = await requestJson<StatusDocument>(target, 'GET', values.check ? '/v1/status?check=true' : '/v1/status');
  io.out(values.json ? `${JSON.stringify(doc, null, 2)}\n` : renderStatus(doc));
  return doc.ready ? 0 : 3;
}
