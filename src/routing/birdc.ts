/**
 * BIRD's control replies as `birdc -v` prints them: each line starts with a four-digit reply
 * code (a `-` after it when more lines follow), or a space to continue the previous code.
 * The codes are BIRD's documented protocol (doc/reply_codes: 0xxx done, 1xxx table entries,
 * 2xxx table headers, 8xxx runtime errors, 9xxx parse errors); the text is only read for the
 * tables it carries.
 */
export interface Reply {
  readonly code: number;
  readonly text: string;
}

/** PURE: the reply lines of one birdc -v run. */
export function parseReplies(out: string): Reply[] {
  const replies: Reply[] = [];
  let code = 0;
  for (const line of out.split('\n')) {
    const m = /^(\d{4})[- ](.*)$/.exec(line);
    if (m) {
      code = Number(m[1]);
      replies.push({ code, text: m[2] as string });
    } else if (line.startsWith(' ') && code !== 0) {
      // birdc prints a continuation with the code's columns blanked.
      replies.push({ code, text: line.replace(/^ {1,5}/, '') });
    }
  }
  return replies;
}

/** PURE: the first error reply (8xxx, 9xxx), or undefined. */
export function errorOf(replies: readonly Reply[]): Reply | undefined {
  return replies.find((r) => r.code >= 8000);
}

export interface ProtocolRow {
  readonly name: string;
  readonly proto: string;
  /** BIRD's protocol state: up, start, down, stop. */
  readonly state: string;
  /** When it entered that state (timeformat protocol iso long). */
  readonly since: string;
  /** For BGP: Established, Active, Connect, Idle…, and the last error where there is one. */
  readonly info: string;
}

/** PURE: `show protocols` (reply 1002 rows). */
export function parseProtocols(replies: readonly Reply[]): ProtocolRow[] {
  const rows: ProtocolRow[] = [];
  for (const r of replies) {
    if (r.code !== 1002) continue;
    const m = /^(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d{4}-\d\d-\d\d \S+|\S+)\s*(.*)$/.exec(r.text);
    if (m) rows.push({ name: m[1]!, proto: m[2]!, state: m[4]!, since: m[5]!, info: (m[6] ?? '').trim() });
  }
  return rows;
}

export interface BfdRow {
  readonly peer: string;
  readonly interface: string;
  /** Up, Down, Init, AdminDown. */
  readonly state: string;
}

/** PURE: `show bfd sessions` (reply 1020: a protocol line, a header, then one row per session). */
export function parseBfdSessions(replies: readonly Reply[]): BfdRow[] {
  const rows: BfdRow[] = [];
  for (const r of replies) {
    if (r.code !== 1020) continue;
    const f = r.text.trim().split(/\s+/);
    // Rows start with an address; the protocol's name line ends with ':', the header with words.
    if (f.length >= 3 && /^[0-9a-fA-F:.]+$/.test(f[0]!) && /[.:]/.test(f[0]!)) rows.push({ peer: f[0]!, interface: f[1]!, state: f[2]! });
  }
  return rows;
}

/** PURE: the prefixes of `show route export <protocol>` (one per route line; `Table …:` headers skipped). */
export function parseRoutePrefixes(replies: readonly Reply[]): string[] {
  const out: string[] = [];
  for (const r of replies) {
    if (r.code < 1000 || r.code >= 2000) continue;
    const m = /^([0-9a-fA-F:.]+\/\d+)\s/.exec(r.text);
    if (m) out.push(m[1]!);
  }
  return out;
}
