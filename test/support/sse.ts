import { expect } from "bun:test";

/** The `data:` payloads of a Server-Sent Events body, "[DONE]" included. */
export async function sseData(response: Response): Promise<string[]> {
  const text = await response.text();
  return text
    .split("\n\n")
    .filter((event) => event !== "")
    .map((event) => {
      expect(event.startsWith("data: ")).toBe(true);
      return event.slice(6);
    });
}
