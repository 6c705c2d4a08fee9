import type { FlagSpecs } from "./args";

/** One `kvedge <name>` subcommand. */
export interface Command {
  readonly name: string;
  /** One line for `kvedge --help`. */
  readonly summary: string;
  /** The full text of `kvedge <name> --help`. */
  readonly help: string;
  readonly flags: FlagSpecs;
  /** Runs with the arguments after the command name; resolves to the exit code. */
  run(argv: string[]): Promise<number>;
}

/** Every command takes -h/--help. */
export const HELP_FLAG = { help: { kind: "boolean", short: "h" } } as const;
