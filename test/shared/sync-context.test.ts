import { expect } from "chai";
import { ROOT_CONTEXT, createContextKey } from "@opentelemetry/api";
import { SyncContextManager } from "../../src/shared/tracing/sync-context.js";

describe("the synchronous context manager", () => {
  const key = createContextKey("test");
  const ctx = ROOT_CONTEXT.setValue(key, "a");

  it("holds a context for the synchronous extent of with, nested, and restores it after a throw", () => {
    const manager = new SyncContextManager();
    expect(manager.active()).to.equal(ROOT_CONTEXT);
    const inner = ctx.setValue(key, "b");
    const seen = manager.with(ctx, (x: number) => [manager.active().getValue(key), manager.with(inner, () => manager.active().getValue(key)), manager.active().getValue(key), x], undefined, 7);
    expect(seen).to.deep.equal(["a", "b", "a", 7]);
    expect(() =>
      manager.with(ctx, () => {
        throw new Error("boom");
      }),
    ).to.throw("boom");
    expect(manager.active()).to.equal(ROOT_CONTEXT);
  });

  it("does not carry a context across an await", async () => {
    const manager = new SyncContextManager();
    const later = await manager.with(ctx, async () => {
      expect(manager.active().getValue(key)).to.equal("a");
      await Promise.resolve();
      return manager.active();
    });
    expect(later).to.equal(ROOT_CONTEXT);
  });

  it("binds a function to a context, keeping this and the arguments", () => {
    const manager = new SyncContextManager();
    function times(this: { n: number }, x: number): [unknown, number] {
      return [manager.active().getValue(key), this.n * x];
    }
    const bound = manager.bind(ctx, times);
    expect(bound.call({ n: 2 }, 3)).to.deep.equal(["a", 6]);
    expect(manager.active()).to.equal(ROOT_CONTEXT);
    expect(manager.bind(ctx, 5)).to.equal(5);
  });
});
