// Where an execserver's jobs work, seen from outside: the job directories under a temp
// root (at any depth: the runner keeps them in a directory of its own per process).
import { readdirSync } from "node:fs";
import { join } from "node:path";

/** Every directory named slotbroker-job-* under `root` (up to two levels down), sorted. */
export function jobDirsUnder(root: string): string[] {
  const found: string[] = [];
  const walk = (dir: string, depth: number): void => {
    let entries;
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return; // gone meanwhile
    }
    for (const e of entries) {
      if (!e.isDirectory()) continue;
      if (e.name.startsWith("slotbroker-job-")) found.push(join(dir, e.name));
      else if (depth < 2) walk(join(dir, e.name), depth + 1);
    }
  };
  walk(root, 0);
  return found.sort();
}
