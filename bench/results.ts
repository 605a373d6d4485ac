import type { BulkFigures } from './bulk.js';
import type { CommandFigures } from './commands.js';
import type { CompareRun } from './compare.js';
import type { ConnRates } from './connrate.js';
import type { Memory } from './daemon.js';
import type { Floors } from './floors.js';
import type { BackendInfo, BackendName } from './gateway.js';
import type { Options } from './options.js';
import type { Mix } from './workload.js';

export interface SizeFigures {
  readonly mix: Mix;
  /** PUT /v1/state from the previous size's state (the first: from an empty gateway). */
  readonly fillMs: number;
  readonly floors: Floors;
  readonly api: CommandFigures;
  readonly shim: CommandFigures;
  /** A fresh daemon's first rounds (the first size only): not in `api` or `shim`. */
  readonly warmup?: { readonly rounds: number; readonly api: CommandFigures; readonly shim: CommandFigures };
  readonly memory?: Memory;
}

export interface BackendFigures {
  readonly backend: BackendName;
  info?: BackendInfo;
  readonly sizes: SizeFigures[];
  connRate?: ConnRates & { readonly size: number };
  bulk?: BulkFigures;
  readonly errors: string[];
}

export interface Results {
  readonly options: Options;
  readonly environment: Record<string, string>;
  readonly backends: BackendFigures[];
  compare?: { readonly prefix: string; readonly runs: CompareRun[]; error?: string };
  readonly notes: string[];
}
