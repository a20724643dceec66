import { expect } from "chai";
import { WantBook, type ParkedWant } from "../../src/execserver/want-book.js";

// A deliberately naive model of the grant rule, built from arrays and linear scans, to
// check the linked structure against.
class ReferenceBook {
  wants: { id: string; owner: string; priority: number }[] = [];
  // per priority: ring of owners in round-robin order and the cursor index
  rings = new Map<number, { ring: string[]; cursor: number }>();

  park(id: string, owner: string, priority: number): void {
    const hadOwnerInClass = this.wants.some((w) => w.owner === owner && w.priority === priority);
    this.wants.push({ id, owner, priority });
    if (hadOwnerInClass) return;
    const r = this.rings.get(priority) ?? { ring: [], cursor: 0 };
    this.rings.set(priority, r);
    if (r.ring.length === 0) r.ring = [owner];
    else {
      r.ring.splice(r.cursor, 0, owner);
      r.cursor++;
    }
  }

  pop(): string | undefined {
    if (this.wants.length === 0) return undefined;
    const top = Math.max(...this.wants.map((w) => w.priority));
    const r = this.rings.get(top)!;
    const owner = r.ring[r.cursor]!;
    const index = this.wants.findIndex((w) => w.owner === owner && w.priority === top);
    const [want] = this.wants.splice(index, 1);
    if (this.wants.some((w) => w.owner === owner && w.priority === top)) r.cursor = (r.cursor + 1) % r.ring.length;
    else this.leave(top, owner);
    return want!.id;
  }

  remove(id: string): boolean {
    const index = this.wants.findIndex((w) => w.id === id);
    if (index < 0) return false;
    const [want] = this.wants.splice(index, 1);
    if (!this.wants.some((w) => w.owner === want!.owner && w.priority === want!.priority)) this.leave(want!.priority, want!.owner);
    return true;
  }

  removeOwner(owner: string): void {
    for (const w of this.wants.filter((x) => x.owner === owner)) this.remove(w.id);
  }

  private leave(priority: number, owner: string): void {
    const r = this.rings.get(priority)!;
    const idx = r.ring.indexOf(owner);
    r.ring.splice(idx, 1);
    if (idx < r.cursor) r.cursor--;
    if (r.cursor >= r.ring.length) r.cursor = 0;
    if (r.ring.length === 0) this.rings.delete(priority);
  }

  clone(): ReferenceBook {
    const copy = new ReferenceBook();
    copy.wants = this.wants.map((w) => ({ ...w }));
    for (const [p, r] of this.rings) copy.rings.set(p, { ring: [...r.ring], cursor: r.cursor });
    return copy;
  }

  positionOf(id: string): number | undefined {
    if (!this.wants.some((w) => w.id === id)) return undefined;
    const copy = this.clone();
    for (let ahead = 0; ; ahead++) if (copy.pop() === id) return ahead;
  }
}

/** Deterministic PRNG so a failing fuzz run can be replayed. */
function mulberry32(seed: number): () => number {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function drain(book: WantBook<string>): string[] {
  const out: string[] = [];
  for (let w = book.pop(); w; w = book.pop()) out.push(w.value);
  return out;
}

describe("WantBook", () => {
  const a = { name: "a" };
  const b = { name: "b" };
  const c = { name: "c" };

  it("serves the highest priority class first", () => {
    const book = new WantBook<string>();
    book.park(a, 0, "a-low-1");
    book.park(a, 0, "a-low-2");
    book.park(b, 5, "b-high");
    book.park(c, -3, "c-negative");
    book.park(a, 9, "a-urgent");
    expect(drain(book)).to.deep.equal(["a-urgent", "b-high", "a-low-1", "a-low-2", "c-negative"]);
  });

  it("deals a class round-robin across connections, FIFO within one", () => {
    const book = new WantBook<string>();
    for (let i = 1; i <= 100; i++) book.park(a, 0, `a${i}`);
    book.park(b, 0, "b1");
    book.park(b, 0, "b2");
    book.park(c, 0, "c1");
    expect(drain(book).slice(0, 8)).to.deep.equal(["a1", "b1", "c1", "a2", "b2", "a3", "a4", "a5"]);
  });

  it("serves a connection with one want before a sibling's hundredth", () => {
    const book = new WantBook<string>();
    for (let i = 1; i <= 100; i++) book.park(a, 0, `a${i}`);
    expect(book.pop()!.value).to.equal("a1");
    const late = book.park(b, 0, "b1");
    expect(book.positionOf(late)).to.equal(1);
    expect(drain(book).indexOf("b1")).to.equal(1);
  });

  it("popOwner takes an owner's oldest want in the most urgent class without moving the turn", () => {
    const book = new WantBook<string>();
    book.park(a, 0, "a1");
    book.park(a, 0, "a2");
    book.park(b, 0, "b1");
    expect(book.pop()!.value).to.equal("a1");
    // b's turn is next; a takes another want out of turn (its withdrawn offer's replacement).
    expect(book.popOwner(a, 0)!.value).to.equal("a2");
    expect(book.popOwner(a, 0)).to.equal(undefined);
    expect(book.popOwner(c, 0)).to.equal(undefined);
    book.park(c, 5, "c-high");
    book.park(b, 0, "b2");
    // A more urgent class has wants: no out-of-turn want from a lower one.
    expect(book.popOwner(b, 0)).to.equal(undefined);
    expect(drain(book)).to.deep.equal(["c-high", "b1", "b2"]);
  });

  it("passTurn moves the cursor past an owner whose turn it is, and leaves other owners' turns alone", () => {
    const book = new WantBook<string>();
    book.park(a, 0, "a1");
    book.park(a, 0, "a2");
    book.park(b, 0, "b1");
    book.park(c, 3, "c-high");
    // Not a's turn in class 3 (it has no queue there), nor b's in class 0: nothing moves.
    book.passTurn(a, 3);
    book.passTurn(b, 0);
    expect(book.pop()!.value).to.equal("c-high");
    expect(book.peek()!.value).to.equal("a1");
    book.passTurn(a, 0);
    expect(drain(book)).to.deep.equal(["b1", "a1", "a2"]);
  });

  it("removes single wants and whole connections without disturbing the order", () => {
    const book = new WantBook<string>();
    const handles = new Map<string, ParkedWant<string>>();
    for (const owner of [a, b, c]) for (let i = 1; i <= 3; i++) {
      const id = `${(owner).name}${i}`;
      handles.set(id, book.park(owner, 0, id));
    }
    expect(book.remove(handles.get("a1")!)).to.equal(true);
    expect(book.remove(handles.get("a1")!)).to.equal(false);
    const removed: string[] = [];
    expect(book.removeOwner(b, (w) => removed.push(w.value))).to.equal(3);
    expect(removed).to.deep.equal(["b1", "b2", "b3"]);
    expect(book.size).to.equal(5);
    expect(book.sizeOf(b)).to.equal(0);
    expect(drain(book)).to.deep.equal(["a2", "c1", "a3", "c2", "c3"]);
    expect(book.size).to.equal(0);
    expect(book.depth()).to.deep.equal([]);
  });

  it("reports depth by priority, most urgent first", () => {
    const book = new WantBook<string>();
    book.park(a, 1, "x");
    book.park(b, 1, "y");
    book.park(a, 7, "z");
    book.park(c, -2, "w");
    expect(book.depth()).to.deep.equal([
      { priority: 7, wants: 1 },
      { priority: 1, wants: 2 },
      { priority: -2, wants: 1 },
    ]);
  });

  it("positionOf replays the grant rule without mutating the book", () => {
    const book = new WantBook<string>();
    const handles: ParkedWant<string>[] = [];
    for (let i = 0; i < 5; i++) handles.push(book.park(a, 0, `a${i}`));
    for (let i = 0; i < 2; i++) handles.push(book.park(b, 0, `b${i}`));
    handles.push(book.park(c, 3, "c-high"));
    const positions = handles.map((h) => book.positionOf(h));
    expect(book.size).to.equal(8);
    const order = drain(book);
    expect(positions).to.deep.equal(handles.map((h) => order.indexOf(h.value)));
    expect(book.positionOf(handles[0]!)).to.equal(undefined);
  });

  it("agrees with a naive reference model under random operations", () => {
    for (let seed = 1; seed <= 60; seed++) {
      const random = mulberry32(seed);
      const book = new WantBook<string>();
      const ref = new ReferenceBook();
      const owners = Array.from({ length: 1 + Math.floor(random() * 6) }, (_, i) => ({ name: `o${i}` }));
      const live = new Map<string, ParkedWant<string>>();
      let next = 0;
      for (let step = 0; step < 400; step++) {
        const r = random();
        if (r < 0.45) {
          const owner = owners[Math.floor(random() * owners.length)]!;
          const priority = Math.floor(random() * 4) - 1;
          const id = `w${next++}`;
          live.set(id, book.park(owner, priority, id));
          ref.park(id, owner.name, priority);
        } else if (r < 0.7) {
          const got = book.pop()?.value;
          expect(got, `seed ${seed} step ${step} pop`).to.equal(ref.pop());
          if (got) live.delete(got);
        } else if (r < 0.85 && live.size > 0) {
          const ids = [...live.keys()];
          const id = ids[Math.floor(random() * ids.length)]!;
          expect(book.remove(live.get(id)!)).to.equal(ref.remove(id));
          live.delete(id);
        } else if (r < 0.9) {
          const owner = owners[Math.floor(random() * owners.length)]!;
          book.removeOwner(owner, (w) => live.delete(w.value));
          ref.removeOwner(owner.name);
        } else if (live.size > 0) {
          const ids = [...live.keys()];
          const id = ids[Math.floor(random() * ids.length)]!;
          expect(book.positionOf(live.get(id)!), `seed ${seed} step ${step} position`).to.equal(ref.positionOf(id));
        }
        expect(book.size).to.equal(ref.wants.length);
      }
      const expected: string[] = [];
      for (let id = ref.pop(); id; id = ref.pop()) expected.push(id);
      expect(drain(book), `seed ${seed} final order`).to.deep.equal(expected);
    }
  });
});
