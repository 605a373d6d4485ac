/** A command's result exactly as the shim prints it (SPEC §1: stdout, stderr, exit status). */
export interface CommandOutput {
  readonly status: number;
  readonly stdout: string;
  readonly stderr: string;
}

export class Output {
  private readonly out: string[] = [];
  private readonly err: string[] = [];

  line(s: string): void {
    this.out.push(s);
  }

  error(s: string): void {
    this.err.push(s);
  }

  result(status: number): CommandOutput {
    const join = (l: string[]) => (l.length ? `${l.join('\n')}\n` : '');
    return { status, stdout: join(this.out), stderr: join(this.err) };
  }
}
