import { RuleConflictError } from '../model/errors.js';
import { quoteHeld } from '../dataplane/netfilter/iptables/ruleText.js';

/**
 * An error as the user reads it: a rule conflict, thrown by the operations with both rules
 * typed, quotes the existing rule as the script's iptables rule (SPEC §2), whichever backend
 * runs. Every door that reports an error (the script's verbs, the API) words it here.
 */
export function worded(e: unknown): unknown {
  return e instanceof RuleConflictError ? e.worded(quoteHeld) : e;
}
