/**
 * QueueService.Watch: emits an item whenever its state or position changes and ends after it
 * finished. Items this fylr holds wake the loop through the dispatcher's live table at
 * once; a state change on any other fylr wakes it through the dispatcher's LISTEN/NOTIFY.
 * The database is still read every pollMs as the safety net (and for position changes,
 * which notify nobody).
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { WatchResponseSchema, type WatchResponse } from "../../gen/slotbroker/v1/queue_pb.js";
import { itemToProto, Wakeup } from "../dispatcher/index.js";
import { linkedAbortController, workOver } from "../shared/abort.js";
import { changeKey, isFinished, snapshot, type ItemViewDeps } from "./item-view.js";

/** Options of one watch. */
export interface WatchOptions {
  /** How often the database is read when nothing woke the loop (default 500 ms). */
  readonly pollMs?: number;
  /** The call's signal: the client went away. */
  readonly signal: AbortSignal;
  /** The server's: shutting down ends every watch with UNAVAILABLE (the client watches again). */
  readonly shutdown?: AbortSignal;
}

/** Follows one item until it finished; yields the item and its position on each change. */
export async function* watchItem(deps: ItemViewDeps, id: string, options: WatchOptions): AsyncGenerator<WatchResponse> {
  const controller = linkedAbortController(options.signal, options.shutdown);
  const signal = controller.signal;
  const wakeup = new Wakeup();
  const unsubscribe = deps.dispatcher.followItem(id, () => wakeup.notify());
  try {
    let last: string | undefined;
    for (;;) {
      const now = await snapshot(deps, id);
      const key = changeKey(now);
      if (key !== last) {
        last = key;
        yield create(WatchResponseSchema, { item: itemToProto(now.item), position: now.position });
      }
      if (isFinished(now.item)) return;
      try {
        await wakeup.wait(options.pollMs ?? 500, signal);
      } catch (err) {
        if (options.shutdown?.aborted && !options.signal.aborted) {
          throw new ConnectError("the fylr is shutting down; watch again (any fylr answers)", Code.Unavailable);
        }
        throw err;
      }
    }
  } finally {
    unsubscribe();
    controller.abort(workOver);
  }
}
