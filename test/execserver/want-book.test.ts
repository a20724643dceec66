import { expect } from "chai";
import { WantBook, type ParkedWant } from "../../src/execserver/want-book.js";

// A deliberately naive model of the grant rule, built from arrays and linear scans, to
// check the linked structure against.
interface RefWant {
  id: string;
  owner: string;
  priority: number;
  key: string;
}

// Round-robin rings: a ring of names, the index whose turn it is and, for key rings, the
// grants left in that turn (0: not started; set from the key's weight at its first grant).
interface Ring {
  ring: string[];
  cursor: number;
  credit: number;
}

class ReferenceBook {
  wants: RefWant[] = [];
  // per priority: ring of owners in round-robin order
  rings = new Map<number, Ring>();
  // per priority and owner: ring of keys in weighted round-robin order
  keyRings = new Map<string, Ring>();
  // per priority, owner and key: the weight of its latest want
  weights = new Map<string, number>();

  park(id: string, owner: string, priority: number, key = "", weight = 1): void {
    const hadOwnerInClass = this.has(owner, priority);
    const hadKey = this.has(owner, priority, key);
    this.wants.push({ id, owner, priority, key });
    this.weights.set(`${priority}/${owner}/${key}`, weight);
    if (!hadKey) {
      const kr = this.keyRings.get(`${priority}/${owner}`);
      if (!kr) this.keyRings.set(`${priority}/${owner}`, { ring: [key], cursor: 0, credit: 0 });
      else {
        kr.ring.splice(kr.cursor, 0, key);
        kr.cursor++;
      }
    }
    if (hadOwnerInClass) return;
    const r = this.rings.get(priority) ?? { ring: [], cursor: 0, credit: 0 };
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
    const id = this.take(owner, top);
    if (this.has(owner, top)) r.cursor = (r.cursor + 1) % r.ring.length;
    else this.leave(top, owner);
    return id;
  }

  popOwner(owner: string, priority: number): string | undefined {
    if (!this.has(owner, priority) || Math.max(...this.wants.map((w) => w.priority)) !== priority) return undefined;
    const id = this.take(owner, priority);
    if (!this.has(owner, priority)) this.leave(priority, owner);
    return id;
  }

  passTurn(owner: string, priority: number): void {
    const r = this.rings.get(priority);
    if (r && r.ring[r.cursor] === owner) r.cursor = (r.cursor + 1) % r.ring.length;
  }

  remove(id: string): boolean {
    const index = this.wants.findIndex((w) => w.id === id);
    if (index < 0) return false;
    const [want] = this.wants.splice(index, 1);
    const { owner, priority, key } = want!;
    if (!this.has(owner, priority, key)) this.leaveKey(priority, owner, key);
    if (!this.has(owner, priority)) this.leave(priority, owner);
    return true;
  }

  removeOwner(owner: string): void {
    for (const w of this.wants.filter((x) => x.owner === owner)) this.remove(w.id);
  }

  clone(): ReferenceBook {
    const copy = new ReferenceBook();
    copy.wants = this.wants.map((w) => ({ ...w }));
    for (const [p, r] of this.rings) copy.rings.set(p, { ...r, ring: [...r.ring] });
    for (const [k, r] of this.keyRings) copy.keyRings.set(k, { ...r, ring: [...r.ring] });
    copy.weights = new Map(this.weights);
    return copy;
  }

  positionOf(id: string): number | undefined {
    if (!this.wants.some((w) => w.id === id)) return undefined;
    const copy = this.clone();
    for (let ahead = 0; ; ahead++) if (copy.pop() === id) return ahead;
  }

  private has(owner: string, priority: number, key?: string): boolean {
    return this.wants.some((w) => w.owner === owner && w.priority === priority && (key === undefined || w.key === key));
  }

  // The owner's oldest want under the key whose turn it is; the turn ends after `weight` grants.
  private take(owner: string, priority: number): string {
    const kr = this.keyRings.get(`${priority}/${owner}`)!;
    const key = kr.ring[kr.cursor]!;
    const index = this.wants.findIndex((w) => w.owner === owner && w.priority === priority && w.key === key);
    const [want] = this.wants.splice(index, 1);
    if (kr.credit === 0) kr.credit = this.weights.get(`${priority}/${owner}/${key}`)!;
    if (--kr.credit === 0) kr.cursor = (kr.cursor + 1) % kr.ring.length;
    if (!this.has(owner, priority, key)) this.leaveKey(priority, owner, key);
    return want!.id;
  }

  private leaveKey(priority: number, owner: string, key: string): void {
    const kr = this.keyRings.get(`${priority}/${owner}`)!;
    const idx = kr.ring.indexOf(key);
    kr.ring.splice(idx, 1);
    if (kr.ring.length === 0) {
      this.keyRings.delete(`${priority}/${owner}`);
      return;
    }
    if (idx < kr.cursor) kr.cursor--;
    else if (idx === kr.cursor) {
      // its turn ends; the next key starts a fresh one
      if (kr.cursor >= kr.ring.length) kr.cursor = 0;
      kr.credit = 0;
    }
  }

  private leave(priority: number, owner: string): void {
    const r = this.rings.get(priority)!;
    const idx = r.ring.indexOf(owner);
    r.ring.splice(idx, 1);
    if (idx < r.cursor) r.cursor--;
    if (r.cursor >= r.ring.length) r.cursor = 0;
    if (r.ring.length === 0) this.rings.delete(priority);
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
      { priority: 7, wants: 1, keys: 1 },
      { priority: 1, wants: 2, keys: 1 },
      { priority: -2, wants: 1, keys: 1 },
    ]);
    // Keys are counted once per class, however many connections use them.
    book.park(b, 1, "k1", "tenant-1");
    book.park(c, 1, "k2", "tenant-1");
    book.park(c, 1, "k3", "tenant-2");
    expect(book.depth()[1]).to.deep.equal({ priority: 1, wants: 5, keys: 3 });
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

  describe("fairness keys", () => {
    it("orders priority, then connections round-robin, then keys round-robin, then FIFO", () => {
      const book = new WantBook<string>();
      for (const id of ["x1", "x2"]) book.park(a, 0, `a-${id}`, "x");
      for (const id of ["y1", "y2"]) book.park(a, 0, `a-${id}`, "y");
      for (const id of ["b1", "b2", "b3"]) book.park(b, 0, id);
      book.park(c, 1, "c-urgent", "z");
      expect(drain(book)).to.deep.equal(["c-urgent", "a-x1", "b1", "a-y1", "b2", "a-x2", "b3", "a-y2"]);
    });

    it("gives a key of weight w exactly w grants per turn of a weight-1 key", () => {
      const book = new WantBook<string>();
      for (let i = 0; i < 300; i++) book.park(a, 0, "heavy", "h", 3);
      for (let i = 0; i < 300; i++) book.park(a, 0, "light", "l", 1);
      for (let i = 0; i < 300; i++) book.park(a, 0, "mid", "m", 2);
      const order = drain(book);
      expect(order.slice(0, 12)).to.deep.equal(["heavy", "heavy", "heavy", "light", "mid", "mid", "heavy", "heavy", "heavy", "light", "mid", "mid"]);
      // Over any window of whole rounds the shares are exactly 3:1:2.
      const window = order.slice(0, 600);
      const count = (v: string): number => window.filter((x) => x === v).length;
      expect([count("heavy"), count("light"), count("mid")]).to.deep.equal([300, 100, 200]);
    });

    it("serves a connection's default key FIFO, like a connection without keys", () => {
      const book = new WantBook<string>();
      for (let i = 0; i < 5; i++) book.park(a, 0, `a${i}`, "", 1);
      expect(drain(book)).to.deep.equal(["a0", "a1", "a2", "a3", "a4"]);
    });

    it("keeps a key's turn through an unwant in the middle of it and ends it when the key empties", () => {
      const book = new WantBook<string>();
      const h = Array.from({ length: 6 }, (_, i) => book.park(a, 0, `h${i}`, "h", 3));
      for (let i = 0; i < 3; i++) book.park(a, 0, `l${i}`, "l", 1);
      expect(book.pop()!.value).to.equal("h0");
      book.remove(h[1]!);
      // two grants left in the turn: h2 and h3
      expect([book.pop()!.value, book.pop()!.value, book.pop()!.value]).to.deep.equal(["h2", "h3", "l0"]);
      expect(book.pop()!.value).to.equal("h4");
      // the key empties with two grants of its turn left: the next key's turn starts
      book.remove(h[5]!);
      expect(drain(book)).to.deep.equal(["l1", "l2"]);
    });

    it("a key that empties and comes back banks no grants", () => {
      const book = new WantBook<string>();
      book.park(a, 0, "x0", "x", 3);
      for (let i = 0; i < 5; i++) book.park(a, 0, `y${i}`, "y", 1);
      expect([book.pop()!.value, book.pop()!.value]).to.deep.equal(["x0", "y0"]);
      // x returns at the end of the round, after y's turn, with one turn's worth: 3
      for (let i = 1; i <= 4; i++) book.park(a, 0, `x${i}`, "x", 3);
      expect(drain(book)).to.deep.equal(["y1", "x1", "x2", "x3", "y2", "x4", "y3", "y4"]);
    });

    it("a connection that disconnects in the middle of a key's turn and returns starts afresh", () => {
      const book = new WantBook<string>();
      for (let i = 0; i < 3; i++) book.park(a, 0, `ah${i}`, "h", 3);
      book.park(a, 0, "al0", "l", 1);
      book.park(b, 0, "b0");
      book.park(b, 0, "b1");
      expect([book.pop()!.value, book.pop()!.value]).to.deep.equal(["ah0", "b0"]);
      expect(book.removeOwner(a)).to.equal(3);
      book.park(a, 0, "al1", "l", 1);
      book.park(a, 0, "ah3", "h", 3);
      expect(drain(book)).to.deep.equal(["b1", "al1", "ah3"]);
    });

    it("popOwner takes the connection's next want by its key order", () => {
      const book = new WantBook<string>();
      book.park(a, 0, "x0", "x", 1);
      book.park(a, 0, "x1", "x", 1);
      book.park(a, 0, "y0", "y", 1);
      book.park(b, 0, "b0");
      expect(book.pop()!.value).to.equal("x0");
      expect(book.popOwner(a, 0)!.value).to.equal("y0");
      expect(drain(book)).to.deep.equal(["b0", "x1"]);
    });

    it("a later want's weight counts from the key's next turn", () => {
      const book = new WantBook<string>();
      for (let i = 0; i < 4; i++) book.park(a, 0, `x${i}`, "x", 1);
      for (let i = 0; i < 4; i++) book.park(a, 0, `y${i}`, "y", 1);
      expect(book.pop()!.value).to.equal("x0");
      book.park(a, 0, "x4", "x", 2);
      expect(drain(book)).to.deep.equal(["y0", "x1", "x2", "y1", "x3", "x4", "y2", "y3"]);
    });

    it("agrees with a naive reference model under random keyed operations", () => {
      for (let seed = 1; seed <= 80; seed++) {
        const random = mulberry32(1000 + seed);
        const book = new WantBook<string>();
        const ref = new ReferenceBook();
        const owners = Array.from({ length: 1 + Math.floor(random() * 4) }, (_, i) => ({ name: `o${i}` }));
        const keys = ["", "k1", "k2", "k3"];
        const live = new Map<string, ParkedWant<string>>();
        let next = 0;
        for (let step = 0; step < 400; step++) {
          const r = random();
          if (r < 0.45) {
            const owner = owners[Math.floor(random() * owners.length)]!;
            const priority = Math.floor(random() * 2);
            const key = keys[Math.floor(random() * keys.length)]!;
            const weight = 1 + Math.floor(random() * 4);
            const id = `w${next++}`;
            live.set(id, book.park(owner, priority, id, key, weight));
            ref.park(id, owner.name, priority, key, weight);
          } else if (r < 0.65) {
            const got = book.pop()?.value;
            expect(got, `seed ${seed} step ${step} pop`).to.equal(ref.pop());
            if (got) live.delete(got);
          } else if (r < 0.7) {
            const owner = owners[Math.floor(random() * owners.length)]!;
            const priority = Math.floor(random() * 2);
            const got = book.popOwner(owner, priority)?.value;
            expect(got, `seed ${seed} step ${step} popOwner`).to.equal(ref.popOwner(owner.name, priority));
            if (got) live.delete(got);
          } else if (r < 0.74) {
            const owner = owners[Math.floor(random() * owners.length)]!;
            const priority = Math.floor(random() * 2);
            book.passTurn(owner, priority);
            ref.passTurn(owner.name, priority);
          } else if (r < 0.85 && live.size > 0) {
            const ids = [...live.keys()];
            const id = ids[Math.floor(random() * ids.length)]!;
            expect(book.remove(live.get(id)!)).to.equal(ref.remove(id));
            live.delete(id);
          } else if (r < 0.88) {
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
});
