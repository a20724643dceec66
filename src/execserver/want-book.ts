import { PriorityHeap, type HeapItem } from "./priority-heap.js";

// The want-book of one waitgroup. Layout, chosen so that every mutation is O(1) or
// O(log classes) and never walks the book:
//
//   classes: Map priority → PriorityClass, plus a max-heap of the non-empty classes;
//   PriorityClass: an intrusive doubly-linked ring of OwnerQueues (one per connection
//     with wants in that class) and a cursor — the queue whose turn is next;
//   OwnerQueue: an intrusive doubly-linked ring of KeyQueues (one per fairness key the
//     connection has wants under in that class), a cursor — the key whose turn it is —
//     and the grants left in that key's turn (0 until its first grant, then its weight);
//   KeyQueue: an intrusive doubly-linked FIFO of ParkedWants.
//
// A connection that joins a class, or a key that joins a connection's ring, is linked in
// just before the cursor, i.e. at the end of the current round, so it neither jumps the
// queue nor waits more than one round. A key that empties leaves the ring and forgets
// its turn: coming back, it starts afresh and has banked no grants.

/** A want parked in a WantBook; the handle to remove it or ask for its position. */
export class ParkedWant<T> {
  /** @internal */ queue: KeyQueue<T> | undefined = undefined;
  /** @internal */ prev: ParkedWant<T> | undefined = undefined;
  /** @internal */ next: ParkedWant<T> | undefined = undefined;

  constructor(
    /** The caller's payload. */
    readonly value: T,
    /** Priority class; larger is more urgent. */
    readonly priority: number,
    /** The connection (any object, compared by identity) that parked it. */
    readonly owner: object,
  ) {}

  /** True while the want is in a book. */
  get parked(): boolean {
    return this.queue !== undefined;
  }
}

class KeyQueue<T> {
  head: ParkedWant<T> | undefined = undefined;
  tail: ParkedWant<T> | undefined = undefined;
  size = 0;
  ringPrev: KeyQueue<T> = this;
  ringNext: KeyQueue<T> = this;

  constructor(
    readonly key: string,
    /** Grants per turn: the weight of the latest want parked under this key. */
    public weight: number,
    readonly ownerQueue: OwnerQueue<T>,
  ) {}
}

class OwnerQueue<T> {
  /** The key whose turn it is; set as soon as the queue has a want. */
  keyCursor!: KeyQueue<T>;
  /** Grants left in keyCursor's turn; 0 when the turn has not started. */
  credit = 0;
  // Key → its queue, made when a second key arrives; until then keyCursor is the only key,
  // so a connection that sends no keys costs no map.
  keys: Map<string, KeyQueue<T>> | undefined = undefined;
  size = 0;
  ringPrev: OwnerQueue<T> = this;
  ringNext: OwnerQueue<T> = this;

  constructor(
    readonly owner: object,
    readonly cls: PriorityClass<T>,
  ) {}
}

class PriorityClass<T> implements HeapItem {
  heapIndex = -1;
  cursor: OwnerQueue<T> | undefined = undefined;
  size = 0;
  // How many connections have wants under a key in this class: the default key counted
  // apart, so that connections without keys cost no map operations here.
  defaultKeyUses = 0;
  readonly keyUses = new Map<string, number>();

  constructor(readonly priority: number) {}
}

/** Wants parked at one priority. */
export interface PriorityDepthEntry {
  readonly priority: number;
  readonly wants: number;
  /** Distinct fairness keys with wants at this priority, over all connections. */
  readonly keys: number;
}

/** The default fairness key: wants that name none share it. */
export const DEFAULT_KEY = "";

/**
 * Parked wants of one waitgroup, granted by the global rule: highest priority class
 * first, round-robin across owners (connections) within a class, weighted round-robin
 * across an owner's fairness keys (a key of weight w gets w grants in a row per turn),
 * FIFO within a key. An owner that uses only the default key is served FIFO.
 */
export class WantBook<T> {
  private readonly classes = new Map<number, PriorityClass<T>>();
  private readonly heap = new PriorityHeap<PriorityClass<T>>();
  // owner → priority → that owner's queue in that class
  private readonly owners = new Map<object, Map<number, OwnerQueue<T>>>();
  private count = 0;

  /** Number of parked wants. */
  get size(): number {
    return this.count;
  }

  /**
   * Parks a want at the tail of its key's queue within its owner's queue in its class;
   * `weight` (a positive integer) becomes the key's weight from its next turn that has not
   * started yet. O(1) (+O(log classes) for a new class).
   */
  park(owner: object, priority: number, value: T, key: string = DEFAULT_KEY, weight = 1): ParkedWant<T> {
    const want = new ParkedWant(value, priority, owner);
    this.append(this.keyFor(this.queueFor(owner, priority), key, weight), want);
    return want;
  }

  /** Removes and returns the want the grant rule picks next; undefined when empty. */
  pop(): ParkedWant<T> | undefined {
    const cls = this.heap.peek();
    if (!cls) return undefined;
    const queue = cls.cursor!;
    // The turn passes to the next owner whether or not this one has more wants.
    cls.cursor = queue.ringNext;
    return this.take(queue);
  }

  /**
   * Removes and returns the want `owner` has next by its key order in class `priority`,
   * when that class is still the most urgent one; the cursor does not move. For a turn
   * that ended without a grant (the owner withdrew the want it was offered): the owner
   * keeps the turn. O(1).
   */
  popOwner(owner: object, priority: number): ParkedWant<T> | undefined {
    const queue = this.owners.get(owner)?.get(priority);
    if (!queue || this.heap.peek()!.priority !== priority) return undefined;
    return this.take(queue);
  }

  /**
   * Ends `owner`'s turn in class `priority` without granting: when the cursor sits on its
   * queue there, it moves to the next owner. For an offer that never came from pop() (made
   * at once on a free slot, or kept by a withdrawal) and was then declined: the turn it
   * was refused in is spent, exactly as when pop() made it. O(1).
   */
  passTurn(owner: object, priority: number): void {
    const queue = this.owners.get(owner)?.get(priority);
    if (queue && queue.cls.cursor === queue) queue.cls.cursor = queue.ringNext;
  }

  /** The want pop() would return, without removing it. */
  peek(): ParkedWant<T> | undefined {
    return this.heap.peek()?.cursor?.keyCursor.head;
  }

  /** Removes a parked want; false when it was not parked (already granted or removed). */
  remove(want: ParkedWant<T>): boolean {
    if (!want.queue) return false;
    this.unlink(want);
    return true;
  }

  /** Removes every want of `owner`, calling `onRemoved` for each. O(that owner's wants). */
  removeOwner(owner: object, onRemoved?: (want: ParkedWant<T>) => void): number {
    const queues = this.owners.get(owner);
    if (!queues) return 0;
    let removed = 0;
    for (const queue of [...queues.values()]) {
      // Emptying the cursor's key moves the cursor on; the last key's last want drops the queue.
      while (queue.size > 0) {
        for (let want = queue.keyCursor.head; want; ) {
          const next: ParkedWant<T> | undefined = want.next;
          this.unlink(want);
          onRemoved?.(want);
          removed++;
          want = next;
        }
      }
    }
    return removed;
  }

  /** Number of wants `owner` has parked here. O(classes the owner uses). */
  sizeOf(owner: object): number {
    let n = 0;
    for (const queue of this.owners.get(owner)?.values() ?? []) n += queue.size;
    return n;
  }

  /**
   * How many wants the grant rule would pick before `want` if nothing else changed;
   * undefined when it is not parked. Replays the rule without mutating: costs
   * O(classes + position in its key's queue + keys of its owner in its class + owners in
   * its class); every key and owner it visits but the last has a want ahead of it, so this
   * is bounded by the number of wants ahead of it.
   */
  positionOf(want: ParkedWant<T>): number | undefined {
    const key = want.queue;
    if (!key) return undefined;
    const queue = key.ownerQueue;
    const cls = queue.cls;
    let ahead = 0;
    for (const other of this.heap.values()) if (other.priority > cls.priority) ahead += other.size;
    let j = 0;
    for (let w = key.head; w !== want; w = w!.next) j++;
    // Its own owner grants k wants before it; it is served in the owner's round k
    // (0-based): every other owner gets up to k+1 turns first if it comes before it in
    // ring order from the cursor, up to k otherwise.
    const k = ownGrantsBefore(queue, key, j);
    const start = cls.cursor!;
    let passedOwn = false;
    let q = start;
    do {
      if (q === queue) {
        passedOwn = true;
        ahead += k;
      } else if (!passedOwn) {
        ahead += Math.min(q.size, k + 1);
      } else if (k === 0) {
        break;
      } else {
        ahead += Math.min(q.size, k);
      }
      q = q.ringNext;
    } while (q !== start);
    return ahead;
  }

  /** Parked wants per priority class, most urgent first. O(classes log classes). */
  depth(): PriorityDepthEntry[] {
    return this.heap
      .values()
      .map((cls) => ({ priority: cls.priority, wants: cls.size, keys: cls.keyUses.size + (cls.defaultKeyUses > 0 ? 1 : 0) }))
      .sort((a, b) => b.priority - a.priority);
  }

  private queueFor(owner: object, priority: number): OwnerQueue<T> {
    let queues = this.owners.get(owner);
    if (!queues) {
      queues = new Map();
      this.owners.set(owner, queues);
    }
    let queue = queues.get(priority);
    if (queue) return queue;
    let cls = this.classes.get(priority);
    if (!cls) {
      cls = new PriorityClass<T>(priority);
      this.classes.set(priority, cls);
      this.heap.push(cls);
    }
    queue = new OwnerQueue<T>(owner, cls);
    const cursor = cls.cursor;
    if (cursor) {
      // Link just before the cursor: the end of the current round.
      queue.ringPrev = cursor.ringPrev;
      queue.ringNext = cursor;
      cursor.ringPrev.ringNext = queue;
      cursor.ringPrev = queue;
    } else {
      cls.cursor = queue;
    }
    queues.set(priority, queue);
    return queue;
  }

  private keyFor(queue: OwnerQueue<T>, name: string, weight: number): KeyQueue<T> {
    const cursor = queue.size === 0 ? undefined : queue.keyCursor;
    let key = queue.keys ? queue.keys.get(name) : cursor?.key === name ? cursor : undefined;
    if (key) {
      key.weight = weight;
      return key;
    }
    key = new KeyQueue<T>(name, weight, queue);
    const cls = queue.cls;
    if (name === DEFAULT_KEY) cls.defaultKeyUses++;
    else cls.keyUses.set(name, (cls.keyUses.get(name) ?? 0) + 1);
    if (!cursor) {
      queue.keyCursor = key;
      queue.credit = 0;
      return key;
    }
    if (!queue.keys) queue.keys = new Map([[cursor.key, cursor]]);
    queue.keys.set(name, key);
    // Link just before the cursor: the end of the current round.
    key.ringPrev = cursor.ringPrev;
    key.ringNext = cursor;
    cursor.ringPrev.ringNext = key;
    cursor.ringPrev = key;
    return key;
  }

  // Removes and returns the owner queue's next want by its key order. A turn's credit is
  // set at its first grant, from the key about to be read anyway: moving the cursor on
  // does not touch the next key.
  private take(queue: OwnerQueue<T>): ParkedWant<T> {
    const key = queue.keyCursor;
    if (queue.credit === 0) queue.credit = key.weight;
    const want = key.head!;
    if (--queue.credit === 0) queue.keyCursor = key.ringNext;
    this.unlink(want);
    return want;
  }

  private append(key: KeyQueue<T>, want: ParkedWant<T>): void {
    want.queue = key;
    want.prev = key.tail;
    if (key.tail) key.tail.next = want;
    else key.head = want;
    key.tail = want;
    key.size++;
    const queue = key.ownerQueue;
    queue.size++;
    queue.cls.size++;
    this.count++;
  }

  private unlink(want: ParkedWant<T>): void {
    const key = want.queue!;
    if (want.prev) want.prev.next = want.next;
    else key.head = want.next;
    if (want.next) want.next.prev = want.prev;
    else key.tail = want.prev;
    want.queue = want.prev = want.next = undefined;
    key.size--;
    const queue = key.ownerQueue;
    queue.size--;
    queue.cls.size--;
    this.count--;
    if (key.size === 0) this.dropKey(key);
  }

  private dropKey(key: KeyQueue<T>): void {
    const queue = key.ownerQueue;
    const cls = queue.cls;
    if (key.key === DEFAULT_KEY) cls.defaultKeyUses--;
    else {
      const n = cls.keyUses.get(key.key)!;
      if (n === 1) cls.keyUses.delete(key.key);
      else cls.keyUses.set(key.key, n - 1);
    }
    if (key.ringNext === key) {
      this.dropQueue(queue);
      return;
    }
    // Its turn, if it was its turn, ends here: the next key starts a fresh one.
    if (queue.keyCursor === key) {
      queue.keyCursor = key.ringNext;
      queue.credit = 0;
    }
    key.ringPrev.ringNext = key.ringNext;
    key.ringNext.ringPrev = key.ringPrev;
    queue.keys!.delete(key.key);
  }

  private dropQueue(queue: OwnerQueue<T>): void {
    const cls = queue.cls;
    if (queue.ringNext === queue) {
      cls.cursor = undefined;
    } else {
      if (cls.cursor === queue) cls.cursor = queue.ringNext;
      queue.ringPrev.ringNext = queue.ringNext;
      queue.ringNext.ringPrev = queue.ringPrev;
    }
    const queues = this.owners.get(queue.owner)!;
    queues.delete(cls.priority);
    if (queues.size === 0) this.owners.delete(queue.owner);
    if (cls.size === 0) {
      this.classes.delete(cls.priority);
      this.heap.remove(cls);
    }
  }
}

// How many wants `queue` grants before the want at index `j` of `key`, by its key rule:
// round r gives every key of the ring one turn in ring order from the cursor, the cursor's
// turn in round 0 being what is left of it (queue.credit). O(keys of the queue).
function ownGrantsBefore<T>(queue: OwnerQueue<T>, key: KeyQueue<T>, j: number): number {
  const first = queue.keyCursor;
  const credit = queue.credit || first.weight;
  // The round whose turn of `key` serves it.
  const round = key !== first ? Math.floor(j / key.weight) : j < credit ? 0 : 1 + Math.floor((j - credit) / key.weight);
  let grants = j;
  let passed = false;
  let other = first;
  do {
    if (other === key) passed = true;
    else {
      const turns = passed ? round : round + 1;
      if (turns === 0) break;
      const served = other === first ? credit + (turns - 1) * other.weight : turns * other.weight;
      grants += Math.min(other.size, served);
    }
    other = other.ringNext;
  } while (other !== first);
  return grants;
}
