/** The index's invariant checks: the shared ones (src/util/verify.ts) under the index's names. */
export {
  assert,
  fail,
  InvariantError as IndexInvariantError,
  VERIFY as VERIFY_BY_DEFAULT,
} from "../util/verify";
