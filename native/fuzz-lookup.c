/*
 * Randomized check of the index's lookup calls and the store's repeat check, built with
 * AddressSanitizer and UBSan by test/native-lookup-fuzz.test.ts:
 * - kv_lookup_remove / kv_lookup_insert_run / kv_lookup_rehash: random events (runs of
 *   fresh keys, some stopped by a key already held or repeated; removals of held keys,
 *   some twice, some never inserted) on one table that grows and shrinks (rehash)
 *   through the small and the large regime, past 2^21 slots once (the double-multiply
 *   home). Every answer must equal a
 *   model's (a separate map with tombstones), and after every event the table must hold
 *   exactly the model's entries, each findable by a plain probe.
 * - kv_pairs_repeat: random hash arrays (with and without a repeat, parent or not) in a
 *   stamped set sized as the caller sizes it; the answer must equal a quadratic check.
 * The table and every input are heap allocations of their exact size, so a read or
 * write past one is caught (the prefetches may point past the table; they never load).
 *
 *   cc -O1 -g -fsanitize=address,undefined native/fuzz-lookup.c -o fuzz && ./fuzz [events] [seed]
 *
 * Prints two "ok: ..." lines and exits 0, or prints the first difference and exits 1.
 */
#include "kvedge.c"

#include <stdio.h>
#include <stdlib.h>

#include "fuzz-random.h"

static uint32_t word(void) { return below(0xffffffffu); }

static void fail_with(const char* what, uint32_t event) {
  printf("event %u: %s\n", event, what);
  exit(1);
}

/* ---- The table under test, sized as src/index/lookup.ts sizes it ---- */

static uint32_t* table;
static uint32_t capacity, shift, count, grow_at, shrink_at;
static double scale;

static void size_table(uint32_t slots) {
  capacity = slots;
  if (slots <= 1024) {
    uint32_t bits = 0;
    while ((1u << bits) < slots) bits++;
    shift = 32 - bits;
    scale = 0;
    grow_at = slots >> 1;
    shrink_at = bits > 4 ? slots >> 3 : 0;
  } else {
    shift = 0;
    scale = slots * (1.0 / 4294967296.0);
    grow_at = (uint32_t)(slots * 0.8);
    shrink_at = (uint32_t)(slots * 0.4);
  }
  table = calloc(3 * (size_t)slots, sizeof(uint32_t));
}

static void resize(uint32_t slots) {
  uint32_t* old = table;
  const uint32_t old_capacity = capacity;
  size_table(slots);
  kv_lookup_rehash(old, old_capacity, table, capacity, shift, scale);
  free(old);
}

static uint32_t grown(uint32_t pending) {
  if (capacity < 1024) return capacity * 2;
  const uint32_t wanted = (uint32_t)((count + pending) / 0.6) + 1;
  const uint32_t step = (uint32_t)(capacity * 1.25) + 1;
  return wanted > step ? wanted : step;
}

static uint32_t shrunk(void) {
  if (capacity <= 1024) return capacity / 2;
  const uint32_t slots = (uint32_t)(count / 0.6) + 1;
  if (slots > 1024) return slots;
  return count <= 512 ? 1024 : 1025;
}

/* A plain probe: the value of (hi, lo), or 0. */
static uint32_t probe(uint32_t hi, uint32_t lo) {
  uint32_t slot = kv_lookup_home(hi, lo, shift, scale, capacity);
  for (uint32_t steps = 0; steps < capacity; steps++) {
    const uint32_t* e = table + 3 * (size_t)slot;
    if (e[2] == 0) return 0;
    if (e[0] == hi && e[1] == lo) return e[2];
    if (++slot == capacity) slot = 0;
  }
  return 0;
}

/* ---- The model: keys in a growable array, found through tombstoned open addressing ---- */

static uint64_t* model_key;
static uint32_t* model_value;
static uint32_t model_used, model_room;
static uint32_t* model_index; /* slot -> key position + 1; 0xffffffff = tombstone */
static uint32_t model_slots;

static uint32_t model_hash(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return (uint32_t)key;
}

static void model_rebuild(uint32_t slots) {
  free(model_index);
  model_slots = slots;
  model_index = calloc(slots, sizeof(uint32_t));
  uint32_t kept = 0;
  for (uint32_t i = 0; i < model_used; i++) {
    if (model_value[i] == 0) continue;
    model_key[kept] = model_key[i];
    model_value[kept] = model_value[i];
    uint32_t s = model_hash(model_key[kept]) & (slots - 1);
    while (model_index[s] != 0) s = (s + 1) & (slots - 1);
    model_index[s] = ++kept;
  }
  model_used = kept;
}

/* The position of `key` in the model, or -1. */
static int64_t model_find(uint64_t key) {
  for (uint32_t s = model_hash(key) & (model_slots - 1);; s = (s + 1) & (model_slots - 1)) {
    const uint32_t at = model_index[s];
    if (at == 0) return -1;
    if (at != 0xffffffffu && model_value[at - 1] != 0 && model_key[at - 1] == key) return at - 1;
  }
}

static void model_put(uint64_t key, uint32_t value) {
  if (model_used == model_room || 2 * (model_used + 1) > model_slots) {
    if (model_used == model_room) {
      model_room *= 2;
      model_key = realloc(model_key, model_room * sizeof(uint64_t));
      model_value = realloc(model_value, model_room * sizeof(uint32_t));
    }
    uint32_t live = 0;
    for (uint32_t i = 0; i < model_used; i++) live += model_value[i] != 0;
    uint32_t slots = 64;
    while (slots < 4 * (live + 1)) slots *= 2;
    model_rebuild(slots);
  }
  model_key[model_used] = key;
  model_value[model_used] = value;
  uint32_t s = model_hash(key) & (model_slots - 1);
  while (model_index[s] != 0 && model_index[s] != 0xffffffffu) s = (s + 1) & (model_slots - 1);
  model_index[s] = ++model_used;
}

static void model_remove(uint64_t key) {
  for (uint32_t s = model_hash(key) & (model_slots - 1);; s = (s + 1) & (model_slots - 1)) {
    const uint32_t at = model_index[s];
    if (at != 0xffffffffu && model_value[at - 1] != 0 && model_key[at - 1] == key) {
      model_value[at - 1] = 0;
      model_index[s] = 0xffffffffu;
      return;
    }
  }
}

static uint64_t key_of(uint32_t hi, uint32_t lo) { return ((uint64_t)hi << 32) | lo; }

/* Clustered keys in half the draws, so probe runs collide and wrap (spread ones for the
 * long runs that grow the table past 2^21 slots, which a held key would stop). */
static uint64_t fresh_key(uint32_t spread) {
  if (spread) return key_of(word(), word());
  const uint32_t hi = below(2) ? below(3) : word();
  const uint32_t lo = below(2) ? below(50000) : word();
  return key_of(hi, lo);
}

/* A live key of the model (count > 0); compacts the model when removals thinned it. */
static uint64_t live_key(void) {
  for (uint32_t round = 0;; round++) {
    for (uint32_t tries = 0; tries < 64; tries++) {
      const uint32_t i = below(model_used);
      if (model_value[i] != 0) return model_key[i];
    }
    model_rebuild(model_slots);
    if (round > 0) for (uint32_t i = 0; i < model_used; i++) if (model_value[i]) return model_key[i];
  }
}

static void check_all(uint32_t event) {
  uint32_t held = 0, live = 0;
  for (uint32_t s = 0; s < capacity; s++) {
    const uint32_t* e = table + 3 * (size_t)s;
    if (e[2] == 0) continue;
    held++;
    const int64_t at = model_find(key_of(e[0], e[1]));
    if (at < 0 || model_value[at] != e[2]) fail_with("the table holds an entry the model does not", event);
  }
  for (uint32_t i = 0; i < model_used; i++) {
    if (model_value[i] == 0) continue;
    live++;
    if (probe((uint32_t)(model_key[i] >> 32), (uint32_t)model_key[i]) != model_value[i]) {
      fail_with("a model entry is not found by a plain probe", event);
    }
  }
  if (held != count || live != count) fail_with("entry counts differ", event);
}

static uint32_t run_events(uint32_t events) {
  uint32_t limits[2];
  uint32_t next_value = 1, largest = 0, large_events = 0;
  /* Stages: mixed events; runs of 50,000 keys until the table passes 2^21 slots; 40 mixed
   * events there; removals of 50,000 keys down to 2,000 entries; mixed, removal-heavy. */
  uint32_t stage = 0, stage_events = 0;
  for (uint32_t event = 0; event < events; event++) {
    if (stage == 0 && event >= events * 2 / 5) stage = 1;
    if (stage == 1 && capacity > KV_LOOKUP_EXACT_CAPACITY) stage = 2;
    if (stage == 2 && ++stage_events > 40) stage = 3;
    if (stage == 3 && count <= 2000) stage = 4;
    const uint32_t huge = stage == 1;
    const uint32_t drain = stage == 3;
    const uint32_t size = huge || drain ? 50000 : 1 + below(below(10) == 0 ? 2000 : 40);
    uint32_t* keys = malloc(2 * (size_t)size * sizeof(uint32_t));
    const uint32_t inserting = !drain && (huge || count == 0 || below(100) < (stage == 4 ? 20 : 65));
    if (inserting) {
      for (uint32_t k = 0; k < size; k++) {
        const uint64_t key = fresh_key(huge);
        keys[2 * k] = (uint32_t)(key >> 32);
        keys[2 * k + 1] = (uint32_t)key;
      }
      if (!huge && count > 0 && below(5) == 0) {
        const uint64_t key = live_key();
        const uint32_t at = below(size);
        keys[2 * at] = (uint32_t)(key >> 32);
        keys[2 * at + 1] = (uint32_t)key;
      }
      const uint32_t value = next_value;
      next_value += size;
      /* The caller's loop (lookup.ts insertRun): grow for the rest of the run, go on. */
      uint32_t done = 0;
      while (done < size) {
        limits[0] = count;
        limits[1] = grow_at;
        done += kv_lookup_insert_run(table, capacity, shift, scale, keys, done, size - done,
                                     value + done, limits);
        count = limits[0];
        /* It stops right after the insert that passes the threshold, not later. */
        if (count > grow_at + 1) fail_with("an insert run went past its grow threshold", event);
        if (count > grow_at) resize(grown(size - done));
        else if (done < size) break;
      }
      if (count < shrink_at) resize(shrunk());
      /* The model's answer: up to the first key it holds (a repeat in the run included). */
      uint32_t expected = 0;
      for (; expected < size; expected++) {
        const uint64_t key = key_of(keys[2 * expected], keys[2 * expected + 1]);
        if (model_find(key) >= 0) break;
        model_put(key, value + expected);
      }
      if (done != expected) fail_with("an insert run stopped elsewhere than the model", event);
    } else {
      for (uint32_t k = 0; k < size; k++) {
        const uint64_t key = below(10) != 0 ? live_key() : fresh_key(0);
        keys[2 * k] = (uint32_t)(key >> 32);
        keys[2 * k + 1] = (uint32_t)key;
      }
      uint32_t* out = malloc((size_t)size * sizeof(uint32_t));
      uint32_t done = 0;
      while (done < size) {
        limits[0] = count;
        limits[1] = shrink_at;
        done += kv_lookup_remove(table, capacity, shift, scale, keys, done, size - done, out,
                                 done, limits);
        count = limits[0];
        if (count + 1 < shrink_at) fail_with("removals went past their shrink threshold", event);
        if (count < shrink_at) resize(shrunk());
      }
      for (uint32_t k = 0; k < size; k++) {
        const uint64_t key = key_of(keys[2 * k], keys[2 * k + 1]);
        const int64_t at = model_find(key);
        const uint32_t want = at < 0 ? 0 : model_value[at];
        if (out[k] != want) fail_with("a removal returned another value than the model", event);
        if (at >= 0) model_remove(key);
      }
      free(out);
    }
    free(keys);
    if (capacity > largest) largest = capacity;
    large_events += capacity > KV_LOOKUP_EXACT_CAPACITY;
    const uint32_t every = capacity > 65536 ? 8 : 1;
    if (event % every == 0 || event + 1 == events) check_all(event);
  }
  if (largest <= KV_LOOKUP_EXACT_CAPACITY) fail_with("the table never passed 2^21 slots", events);
  if (capacity > 1024) fail_with("the table did not shrink back to the small regime", events);
  printf("ok: %u lookup events, largest table %u slots, %u events above 2^21\n", events, largest,
         large_events);
  return 0;
}

/* ---- kv_pairs_repeat against a quadratic check ---- */

static void run_pairs(uint32_t checks) {
  uint32_t stamp = 0, repeats = 0;
  for (uint32_t c = 0; c < checks; c++) {
    const uint32_t count = below(below(20) == 0 ? 3000 : 60);
    const uint32_t start = below(4);
    const uint32_t words = 2 * (start + count);
    uint32_t* hashes = malloc((words == 0 ? 1 : words) * sizeof(uint32_t));
    for (uint32_t i = 0; i < words; i++) hashes[i] = below(4) == 0 ? below(3) : word();
    const uint32_t has_parent = below(2);
    const uint32_t parent_hi = below(3), parent_lo = below(2) ? word() : below(3);
    if (count > 1 && below(3) == 0) {
      const uint32_t from = start + below(count), to = start + below(count);
      hashes[2 * to] = hashes[2 * from];
      hashes[2 * to + 1] = hashes[2 * from + 1];
    }
    /* The quadratic answer. */
    uint32_t want = 0;
    for (uint32_t i = start; i < start + count && !want; i++) {
      if (has_parent && hashes[2 * i] == parent_hi && hashes[2 * i + 1] == parent_lo) want = 1;
      for (uint32_t j = start; j < i && !want; j++) {
        if (hashes[2 * i] == hashes[2 * j] && hashes[2 * i + 1] == hashes[2 * j + 1]) want = 1;
      }
    }
    /* The set as normalize.ts sizes it: a power of two, room for count + 1 at load 1/2. */
    uint32_t slots = 16;
    while (slots < 2 * (count + 1)) slots *= 2;
    uint32_t* keys = malloc(2 * (size_t)slots * sizeof(uint32_t));
    uint32_t* stamps = calloc(slots, sizeof(uint32_t));
    for (uint32_t round = 0; round < 2; round++) {
      const uint32_t got = kv_pairs_repeat(keys, stamps, slots - 1, ++stamp, hashes, start, count,
                                           parent_hi, parent_lo, has_parent);
      if (got != want) fail_with("the repeat check differs from the quadratic one", c);
    }
    repeats += want;
    free(keys);
    free(stamps);
    free(hashes);
  }
  printf("ok: %u repeat checks, %u with a repeat\n", checks, repeats);
}

int main(int argc, char** argv) {
  const uint32_t events = argc > 1 ? (uint32_t)strtoul(argv[1], 0, 10) : 4000;
  state = argc > 2 ? strtoull(argv[2], 0, 10) * 0x9e3779b97f4a7c15ull + 1 : 88172645463325252ull;
  model_room = 1024;
  model_key = malloc(model_room * sizeof(uint64_t));
  model_value = malloc(model_room * sizeof(uint32_t));
  model_rebuild(64);
  size_table(16);
  run_events(events);
  run_pairs(events * 5);
  free(table);
  free(model_key);
  free(model_value);
  free(model_index);
  return 0;
}
