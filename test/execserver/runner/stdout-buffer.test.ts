import { expect } from "chai";
import { StdoutBuffer, STDOUT_BUFFER_LIMIT } from "../../../src/execserver/runner/index.js";

describe("runner: stdout receipt buffering", () => {
  it("holds output up to and including exactly 4000 bytes", () => {
    const buffer = new StdoutBuffer();
    expect(STDOUT_BUFFER_LIMIT).to.equal(4000);
    expect(buffer.push(Buffer.alloc(3999, 1)).kind).to.equal("hold");
    expect(buffer.push(Buffer.alloc(1, 2)).kind).to.equal("hold");
    expect(buffer.committed).to.equal(false);
    expect(buffer.total).to.equal(4000);
    expect(buffer.prefix()).to.deep.equal(Buffer.concat([Buffer.alloc(3999, 1), Buffer.alloc(1, 2)]));
  });

  it("commits on the byte that passes the limit, handing over everything so far", () => {
    const buffer = new StdoutBuffer(10);
    expect(buffer.push(Buffer.from("abcdef")).kind).to.equal("hold");
    const step = buffer.push(Buffer.from("ghijkl"));
    expect(step.kind).to.equal("commit");
    expect(step.kind === "commit" && step.data.toString()).to.equal("abcdefghijkl");
    expect(buffer.committed).to.equal(true);
    expect(buffer.prefix().toString()).to.equal("abcdefghij");
  });

  it("forwards later chunks unchanged and keeps counting", () => {
    const buffer = new StdoutBuffer(4);
    buffer.push(Buffer.from("hello"));
    const chunk = Buffer.from("world");
    const step = buffer.push(chunk);
    expect(step.kind).to.equal("forward");
    expect(step.kind === "forward" && step.data).to.equal(chunk);
    expect(buffer.total).to.equal(10);
    expect(buffer.prefix().toString()).to.equal("hell");
  });

  it("commits a single oversized first chunk whole", () => {
    const buffer = new StdoutBuffer(4);
    const step = buffer.push(Buffer.from("0123456789"));
    expect(step.kind === "commit" && step.data.toString()).to.equal("0123456789");
  });

  it("ignores empty chunks while holding", () => {
    const buffer = new StdoutBuffer(4);
    expect(buffer.push(Buffer.alloc(0)).kind).to.equal("hold");
    expect(buffer.total).to.equal(0);
    expect(buffer.prefix().length).to.equal(0);
  });

  it("hands out a prefix that later pushes do not change", () => {
    const buffer = new StdoutBuffer(8);
    buffer.push(Buffer.from("abc"));
    const prefix = buffer.prefix();
    buffer.push(Buffer.from("def"));
    expect(prefix.toString()).to.equal("abc");
  });
});
