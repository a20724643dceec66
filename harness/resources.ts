/**
 * Leak tracking for tests: everything a test starts (servers, clients, pools, child
 * processes) is registered here and must be closed by the test's own hooks. The root
 * hooks fail a test that leaves something opened during it, and fail the run if
 * anything opened in a before-hook outlives its suite file.
 */
interface Tracked {
  readonly name: string;
  readonly close: () => Promise<void> | void;
  readonly test: string | undefined;
}

const open = new Set<Tracked>();
let currentTest: string | undefined;

/** Registers a resource; returns it unchanged. Close it with `release`. */
export function track<T extends object>(resource: T, name: string, close: (r: T) => Promise<void> | void): T {
  const entry: Tracked = { name, close: () => close(resource), test: currentTest };
  open.add(entry);
  handles.set(resource, entry);
  return resource;
}

const handles = new WeakMap<object, Tracked>();

/** Closes a tracked resource (idempotent). */
export async function release(resource: object | undefined): Promise<void> {
  if (!resource) return;
  const entry = handles.get(resource);
  if (!entry || !open.has(entry)) return;
  open.delete(entry);
  await entry.close();
}

/** @internal root hooks */
export function beginTest(title: string): void {
  currentTest = title;
}

/** @internal root hooks: closes and reports what the finished test left open. */
export async function endTest(title: string): Promise<string[]> {
  currentTest = undefined;
  const leaked = [...open].filter((e) => e.test === title);
  for (const entry of leaked) {
    open.delete(entry);
    await entry.close();
  }
  return leaked.map((e) => e.name);
}

/** @internal root hooks: closes and reports everything still open. */
export async function endRun(): Promise<string[]> {
  const leaked = [...open];
  open.clear();
  for (const entry of leaked) await entry.close();
  return leaked.map((e) => e.name);
}
