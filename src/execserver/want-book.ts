import { PriorityHeap, type HeapItem } from "./priority-heap.js";

// The want-book of one waitgroup. Layout, chosen so that every mutation is O(1) or
// O(log classes) and never walks the book:
//
//   classes: Map priority → PriorityClass, plus a max-heap of the non-empty classes;
//   PriorityClass: an intrusive doubly-linked ring of OwnerQueues (one per connection
//     with wants in that class) and a cursor — the queue whose turn is next;
//   OwnerQueue: an intrusive doubly-linked FIFO of ParkedWants.
//
// A connection that joins a class is linked in just before the cursor, i.e. at the end of
// the current round, so it neither jumps the queue nor waits more than one round.

/** A want parked in a WantBook; the handle to remove it or ask for its position. */
export class ParkedWant<T> {
  /** @internal */ queue: OwnerQueue<T> | undefined = undefined;
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

class OwnerQueue<T> {
  head: ParkedWant<T> | undefined = undefined;
  tail: ParkedWant<T> | undefined = undefined;
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

  constructor(readonly priority: number) {}
}

/** Wants parked at one priority. */
export interface PriorityDepthEntry {
  readonly priority: number;
  readonly wants: number;
}

/**
 * Parked wants of one waitgroup, granted by the global rule: highest priority class
 * first, round-robin across owners (connections) within a class, FIFO within an owner.
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

  /** Parks a want at the tail of its owner's queue in its class. O(1) (+O(log classes) for a new class). */
  park(owner: object, priority: number, value: T): ParkedWant<T> {
    const want = new ParkedWant(value, priority, owner);
    this.append(this.queueFor(owner, priority), want);
    return want;
  }

  /** Removes and returns the want the grant rule picks next; undefined when empty. */
  pop(): ParkedWant<T> | undefined {
    const cls = this.heap.peek();
    if (!cls) return undefined;
    const queue = cls.cursor!;
    const want = queue.head!;
    // The turn passes to the next owner whether or not this one has more wants.
    cls.cursor = queue.ringNext;
    this.unlink(want);
    return want;
  }

  /**
   * Removes and returns the oldest want `owner` has in class `priority`, when that class is
   * still the most urgent one; the cursor does not move. For a turn that ended without a
   * grant (the owner withdrew the want it was offered): the owner keeps the turn. O(1).
   */
  popOwner(owner: object, priority: number): ParkedWant<T> | undefined {
    const queue = this.owners.get(owner)?.get(priority);
    if (!queue || this.heap.peek()!.priority !== priority) return undefined;
    const want = queue.head!;
    this.unlink(want);
    return want;
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
    return this.heap.peek()?.cursor?.head;
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
      for (let want = queue.head; want; ) {
        const next: ParkedWant<T> | undefined = want.next;
        this.unlink(want);
        onRemoved?.(want);
        removed++;
        want = next;
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
   * O(classes + position in its own queue + owners in its class), which is bounded by the
   * number of wants ahead of it.
   */
  positionOf(want: ParkedWant<T>): number | undefined {
    const queue = want.queue;
    if (!queue) return undefined;
    const cls = queue.cls;
    let ahead = 0;
    for (const other of this.heap.values()) if (other.priority > cls.priority) ahead += other.size;
    // Its own queue serves it in round k (0-based): every other owner gets up to k+1
    // turns first if it comes before it in ring order from the cursor, up to k otherwise.
    let k = 0;
    for (let w = queue.head; w !== want; w = w!.next) k++;
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
      .map((cls) => ({ priority: cls.priority, wants: cls.size }))
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

  private append(queue: OwnerQueue<T>, want: ParkedWant<T>): void {
    want.queue = queue;
    want.prev = queue.tail;
    if (queue.tail) queue.tail.next = want;
    else queue.head = want;
    queue.tail = want;
    queue.size++;
    queue.cls.size++;
    this.count++;
  }

  private unlink(want: ParkedWant<T>): void {
    const queue = want.queue!;
    if (want.prev) want.prev.next = want.next;
    else queue.head = want.next;
    if (want.next) want.next.prev = want.prev;
    else queue.tail = want.prev;
    want.queue = want.prev = want.next = undefined;
    queue.size--;
    queue.cls.size--;
    this.count--;
    if (queue.size === 0) this.dropQueue(queue);
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
