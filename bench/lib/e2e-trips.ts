// The end-to-end bench's record of each item's trip: when it passed each stage, matched
// from the children's finished-item lines, and the stage medians printed at the end.
import type { ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { percentile } from "./figure.js";

/** When an item passed each stage (epoch ms); which are set depends on the system. */
export interface Trip {
  submit: number;
  /** The slotbroker fylr the submit went to (its index), for the timeline. */
  fylr?: number;
  /** E2E_TIMELINE: when that fylr got the Submit request and wrote its answer. */
  fylrRequest?: number;
  fylrAnswer?: number;
  committed?: number;
  claimed?: number;
  waiting?: number;
  running?: number;
  finishing?: number;
  settled?: number;
  ok?: boolean;
}

/** Finished-item lines from the children, matched with the submits. */
export class Trips {
  private readonly finished = new Map<string, Partial<Trip>>();
  private readonly waiters = new Map<string, () => void>();
  private answers: { fylr: number; submitRequest: number; submitAnswer: number }[] = [];

  follow(child: ChildProcess, key: "item" | "job", index = 0): void {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      if (!line.startsWith("{")) return;
      const record = JSON.parse(line) as Record<string, unknown>;
      if (typeof record.submitRequest === "number") {
        this.answers.push({ fylr: index, submitRequest: record.submitRequest, submitAnswer: record.submitAnswer as number });
        return;
      }
      const id = String(record[key]);
      const trip: Partial<Trip> = { ...(record as Partial<Trip>) };
      if (key === "job") trip.claimed = record.started as number; // graphile's get_job is its claim
      this.finished.set(id, trip);
      this.waiters.get(id)?.();
      this.waiters.delete(id);
    });
  }

  /** Sets the fylr's request and answer times on the trips (each fylr takes one submit at a time). */
  timeline(trips: Trip[]): void {
    for (const trip of trips) {
      const answer = this.answers.find((a) => a.fylr === trip.fylr && a.submitRequest >= trip.submit && a.submitAnswer <= trip.committed!);
      if (answer) [trip.fylrRequest, trip.fylrAnswer] = [answer.submitRequest, answer.submitAnswer];
    }
    this.answers = [];
  }

  /** Resolves with the trip once the item's line came. */
  async wait(id: string, trip: Trip): Promise<Trip> {
    if (!this.finished.has(id)) await new Promise<void>((resolve) => this.waiters.set(id, resolve));
    const done = this.finished.get(id)!;
    this.finished.delete(id);
    if (!done.ok) throw new Error(`item ${id} failed`);
    return { ...done, ...trip };
  }
}

const stageNames = ["claimed", "waiting", "running", "finishing", "settled"] as const;

/**
 * Median ms of each stage step over the trips (a step missing in a system is left out).
 * The claim is measured from the submit: the claiming fylr often has the item before the
 * Submit's answer is back at the client; submit→committed is given on its own.
 */
export function stageMedians(trips: Trip[]): Record<string, number> {
  const median = (steps: number[]): number => Math.round(percentile(steps.sort((x, y) => x - y), 50) * 100) / 100;
  const out: Record<string, number> = { "submit→committed": median(trips.map((t) => t.committed! - t.submit)) };
  const timed = trips.filter((t) => t.fylrAnswer !== undefined);
  if (timed.length > 0) {
    out["submit→fylr request"] = median(timed.map((t) => t.fylrRequest! - t.submit));
    out["fylr request→answer"] = median(timed.map((t) => t.fylrAnswer! - t.fylrRequest!));
    out["answer→committed"] = median(timed.map((t) => t.committed! - t.fylrAnswer!));
  }
  let previous: keyof Trip = "submit";
  for (const stage of stageNames) {
    const steps = trips.filter((t) => t[stage] !== undefined && t[previous] !== undefined).map((t) => (t[stage] as number) - (t[previous] as number));
    if (steps.length === 0) continue;
    steps.sort((x, y) => x - y);
    out[`${previous}→${stage}`] = Math.round(percentile(steps, 50) * 100) / 100;
    previous = stage;
  }
  return out;
}
