// followItem against a server we control: the end state arrives, the end of the stream does
// not (yet). The client must not keep the request open meanwhile: a CLI whose last request
// is still in flight stays alive until the server lets go (a fylr's keep-alive: 5 s).
import { create, toBinary } from "@bufbuild/protobuf";
import { expect } from "chai";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { ItemState, WatchResponseSchema } from "../../gen/slotbroker/v1/queue_pb.js";
import { createQueueClient, followItem } from "../../src/api/index.js";
import { waitFor } from "../../harness/execserver-process.js";

function envelope(flags: number, payload: Uint8Array): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt8(flags, 0);
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

describe("followItem", () => {
  let server: http.Server;
  let ended = false;

  before(async () => {
    server = http.createServer((req, res) => {
      req.resume();
      res.writeHead(200, { "content-type": "application/connect+proto" });
      const update = create(WatchResponseSchema, { item: { id: "11111111-1111-4111-8111-111111111111", state: ItemState.SUCCEEDED } });
      res.write(envelope(0, toBinary(WatchResponseSchema, update)));
      // The end-of-stream message comes much later, as from a slow or busy server.
      const timer = setTimeout(() => {
        ended = true;
        res.end(envelope(2, Buffer.from("{}")));
      }, 4000);
      res.on("close", () => clearTimeout(timer));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  it("closes the Watch once the end state arrived, without waiting for the stream's end", async () => {
    const { port } = server.address() as AddressInfo;
    const client = createQueueClient(`http://127.0.0.1:${port}`);
    const item = await followItem(client, "11111111-1111-4111-8111-111111111111");
    expect(item.state).to.equal(ItemState.SUCCEEDED);
    await waitFor("the Watch's socket to be closed", () => Object.keys(http.globalAgent.sockets).length === 0, 1000, 10);
    expect(ended, "the server had ended the stream").to.equal(false);
  });
});
