/**
 * Lets at most `perTurn` callers through per event-loop turn; the rest wait, first come
 * first served, for later turns (`setImmediate`), so that the I/O of every turn in
 * between is served. The proxy passes each request through one before its costly part
 * (parsing, routing, connecting: about half a millisecond): a burst of a thousand
 * requests then takes many short turns instead of one half-second one, and a health
 * check or a route arriving meanwhile waits a turn, not the burst.
 */
export class TurnGate {
  private passed = 0;
  private resetting = false;
  private readonly waiting: (() => void)[] = [];
  private head = 0;

  constructor(private readonly perTurn: number) {}

  /** Callers waiting for a later turn. */
  get queued(): number {
    return this.waiting.length - this.head;
  }

  /** Resolves in this turn if its share is not used up, else in a later one. */
  pass(): Promise<void> {
    if (this.passed < this.perTurn && this.queued === 0) {
      this.passed++;
      this.nextTurn();
      return Promise.resolve();
    }
    return new Promise<void>((resolve) => {
      this.waiting.push(resolve);
      this.nextTurn();
    });
  }

  private nextTurn(): void {
    if (this.resetting) return;
    this.resetting = true;
    setImmediate(this.turn);
  }

  private readonly turn = (): void => {
    this.resetting = false;
    this.passed = 0;
    while (this.passed < this.perTurn && this.head < this.waiting.length) {
      const resolve = this.waiting[this.head]!;
      this.waiting[this.head++] = noop;
      this.passed++;
      resolve();
    }
    if (this.head === this.waiting.length) {
      this.waiting.length = 0;
      this.head = 0;
    }
    if (this.passed > 0) this.nextTurn();
  };
}

const noop = (): void => {};
