/**
 * One process-wide bound on bytes held for peers that have not finished sending or
 * receiving: HTTP request bodies being received, WebSocket send queues, and ZMTP frames
 * being reassembled. Each is bounded on its own (body limit, backpressure limit, max
 * message bytes), but many peers at once multiply those bounds: 500 half-sent 8 MiB
 * bodies are 4 GB. Past this budget new holders are refused (HTTP 503, WebSocket closed
 * with 1013, ZMTP connection dropped) while the ones already holding carry on.
 */
export const BUFFER_BUDGET_DEFAULT = 1024 * 1024 * 1024;

export class BufferBudget {
  /** Bytes held now, and the holders refused so far. */
  held = 0;
  refused = 0;

  constructor(public limitBytes: number = BUFFER_BUDGET_DEFAULT) {}

  /** Takes `bytes` if they fit under the limit; false (counted) if not. */
  take(bytes: number): boolean {
    if (this.held + bytes > this.limitBytes) {
      this.refused++;
      return false;
    }
    this.held += bytes;
    return true;
  }

  /** Gives back bytes taken. */
  give(bytes: number): void {
    this.held -= bytes;
  }
}

/** The budget the whole process shares (`kvedge serve` sets its limit from the config). */
export const bufferBudget = new BufferBudget();
