/**
 * The injection corpus (test/corpus/injection.json): hostile legacy commands, each with the
 * reason it is hostile, and per command the unmutated base rule its cases mutate.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { REPO_ROOT } from './netns.js';

export interface InjectionCase {
  readonly command: string;
  readonly rules: readonly string[];
  readonly why: string;
}
/** A command's unmutated rule, and per comma field a pattern of how a refusal names it. */
export interface InjectionBase {
  readonly rule: string;
  readonly fields: readonly string[];
}
export const { cases: CORPUS, bases: BASES } = JSON.parse(readFileSync(path.join(REPO_ROOT, 'test', 'corpus', 'injection.json'), 'utf8')) as {
  cases: InjectionCase[];
  bases: Record<string, InjectionBase>;
};

/** How the reason of a refusal where the field count changed (a comma or a blank in the hostile text) names it. */
const COUNT = /comma-separated fields|Expected two interfaces|invalid nft-dnat-map rule: /;

/**
 * The pattern the refusal of `c` must match: the one of the first comma field where its last
 * rule (the invalid one, after any valid ones) departs from the base; or the field count's,
 * where the mutation split or merged fields, or emptied one.
 */
export function hostileField(c: InjectionCase): RegExp {
  const base = BASES[c.command];
  if (!base) throw new Error(`no base rule for ${c.command} in the corpus`);
  const want = base.rule.split(',');
  const rule = c.rules.at(-1) ?? '';
  const got = rule.split(',');
  const at = got.findIndex((v, i) => v !== want[i]);
  const i = at < 0 ? got.length : at;
  const field = base.fields[Math.min(i, base.fields.length - 1)]!;
  const countChanged = got.length !== want.length || /\s/.test(rule) || got[i] === '';
  return new RegExp(countChanged ? `${field}|${COUNT.source}` : field);
}
