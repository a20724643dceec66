/** An element of a PriorityHeap; the heap keeps `heapIndex` current so removal is O(log n). */
export interface HeapItem {
  readonly priority: number;
  heapIndex: number;
}

/**
 * An indexed binary max-heap keyed by `priority`. The want-book keeps one entry per
 * non-empty priority class here, so finding the most urgent class is O(1) and adding or
 * dropping a class is O(log classes) — never a scan.
 */
export class PriorityHeap<T extends HeapItem> {
  private readonly items: T[] = [];

  /** Number of items. */
  get size(): number {
    return this.items.length;
  }

  /** The item with the largest priority, or undefined when empty. */
  peek(): T | undefined {
    return this.items[0];
  }

  /** Adds an item (which must not already be in a heap). */
  push(item: T): void {
    item.heapIndex = this.items.length;
    this.items.push(item);
    this.siftUp(item.heapIndex);
  }

  /** Removes an item that is in this heap. */
  remove(item: T): void {
    const index = item.heapIndex;
    const last = this.items.pop()!;
    item.heapIndex = -1;
    if (last === item) return;
    this.items[index] = last;
    last.heapIndex = index;
    this.siftDown(index);
    this.siftUp(last.heapIndex);
  }

  /** All items, in no particular order. */
  values(): readonly T[] {
    return this.items;
  }

  private siftUp(index: number): void {
    const items = this.items;
    const item = items[index]!;
    while (index > 0) {
      const parentIndex = (index - 1) >> 1;
      const parent = items[parentIndex]!;
      if (parent.priority >= item.priority) break;
      items[index] = parent;
      parent.heapIndex = index;
      index = parentIndex;
    }
    items[index] = item;
    item.heapIndex = index;
  }

  private siftDown(index: number): void {
    const items = this.items;
    const n = items.length;
    const item = items[index]!;
    for (;;) {
      const left = 2 * index + 1;
      if (left >= n) break;
      const right = left + 1;
      const child = right < n && items[right]!.priority > items[left]!.priority ? right : left;
      const childItem = items[child]!;
      if (childItem.priority <= item.priority) break;
      items[index] = childItem;
      childItem.heapIndex = index;
      index = child;
    }
    items[index] = item;
    item.heapIndex = index;
  }
}
