/** A view that owns its whole buffer, so posting it can move the buffer: `view` itself, or a copy of a part of a larger one. */
export function ownBuffer(view: Uint8Array): Uint8Array {
  return view.byteOffset === 0 && view.byteLength === view.buffer.byteLength ? view : view.slice();
}
