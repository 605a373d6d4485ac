import { z } from 'zod';
import { eipSchema, snatSchema, dnatSchema, fipSchema, shareDnatSchema, routeSchema, ifnameSchema, ipSchema } from '../model/rules.js';
import { eipQosSchema, gwQosSchema } from '../model/qos.js';
import { neighbourSchema } from '../model/neighbour.js';

/**
 * The desired state: a plain value. Operations (operations.ts) are pure functions over it;
 * the engine is the only thing that turns it into kernel state.
 */
export const desiredStateSchema = z.object({
  schema: z.literal(1).default(1),
  initialized: z.boolean().default(false),
  /** `ext` is the primary external interface; `secondary` the further uplinks (model/uplinks.ts), absent with one. */
  interfaces: z.object({
    vpc: ifnameSchema,
    ext: ifnameSchema,
    secondary: z.array(z.object({ name: ifnameSchema, gateway: ipSchema.optional() })).optional(),
  }),
  /** Default routes that eip-add installed from GATEWAY_V4 / GATEWAY_V6. */
  defaultRoutes: z.object({ v4: ipSchema.optional(), v6: ipSchema.optional() }).default({}),
  eips: z.array(eipSchema).default([]),
  /** Kept sorted by descending prefix length, a new rule after its equals (SPEC §2 snat-add). */
  snats: z.array(snatSchema).default([]),
  dnats: z.array(dnatSchema).default([]),
  fips: z.array(fipSchema).default([]),
  shareDnats: z.array(shareDnatSchema).default([]),
  routes: z.array(routeSchema).default([]),
  eipQos: z.array(eipQosSchema).default([]),
  qos: z.array(gwQosSchema).default([]),
  /** Static neighbour entries natgw holds PERMANENT (neighbourOperations.ts). */
  neighbours: z.array(neighbourSchema).default([]),
});
export type DesiredState = z.infer<typeof desiredStateSchema>;

export function emptyState(vpc: string, ext: string): DesiredState {
  return desiredStateSchema.parse({ interfaces: { vpc, ext } });
}
