/**
 * The context manager slotbroker registers with the SDK: the active context holds for the
 * synchronous extent of `context.with` and is not carried across awaits or callbacks.
 *
 * Every span here is started with its parent passed explicitly, and a traced item's log
 * lines get the trace ids bound to the task's logger, so nothing needs the context to
 * follow async work. The SDK's default (AsyncLocalStorage) would make Node install
 * async hooks for the whole process on its first use: every promise and every async
 * resource of every item, traced or not, would pay for the propagation.
 */
import { ROOT_CONTEXT, type Context, type ContextManager } from "@opentelemetry/api";

export class SyncContextManager implements ContextManager {
  private current: Context = ROOT_CONTEXT;

  active(): Context {
    return this.current;
  }

  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(context: Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A): ReturnType<F> {
    const previous = this.current;
    this.current = context;
    try {
      return fn.call(thisArg, ...args);
    } finally {
      this.current = previous;
    }
  }

  bind<T>(context: Context, target: T): T {
    if (typeof target !== "function") return target;
    const run = (thisArg: unknown, args: unknown[]): unknown => this.with(context, () => (target as (...a: unknown[]) => unknown).apply(thisArg, args));
    return function (this: unknown, ...args: unknown[]) {
      return run(this, args);
    } as T;
  }

  enable(): this {
    return this;
  }

  disable(): this {
    this.current = ROOT_CONTEXT;
    return this;
  }
}
