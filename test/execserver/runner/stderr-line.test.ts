import { expect } from "chai";
import { capUtf8, LastLineTracker } from "../../../src/execserver/runner/index.js";
import { lineFromBytes } from "../../../src/execserver/runner/stderr-line.js";

function track(chunks: string[], limit?: number): string {
  const tracker = new LastLineTracker(limit);
  for (const chunk of chunks) tracker.push(Buffer.from(chunk));
  return tracker.line();
}

describe("runner: stderr last-line tracker", () => {
  it("returns the last non-empty line, skipping trailing blank lines", () => {
    expect(track(["first\nsecond\n\n   \n\r\n"])).to.equal("second");
  });

  it("counts an unterminated last line", () => {
    expect(track(["first\nsecond"])).to.equal("second");
  });

  it("joins a line split across chunks", () => {
    expect(track(["warn\nfatal: di", "sk ", "full\n"])).to.equal("fatal: disk full");
  });

  it("strips CRLF endings and surrounding whitespace", () => {
    expect(track(["  error: bad input  \r\n"])).to.equal("error: bad input");
  });

  it("is empty when stderr was empty or blank", () => {
    expect(track([])).to.equal("");
    expect(track(["\n\n \n"])).to.equal("");
  });

  it("keeps the first bytes of an over-long line", () => {
    const line = track(["x".repeat(1500) + "\n", "y".repeat(3000)]);
    expect(line).to.equal("y".repeat(1000));
    expect(track(["a".repeat(2000)], 10)).to.equal("a".repeat(10));
  });

  it("never splits a UTF-8 character at the cap", () => {
    // 9 ASCII bytes, then "é" (2 bytes) straddling the 10-byte cap.
    expect(track(["123456789é\n"], 10)).to.equal("123456789");
    expect(track(["12345678é\n"], 10)).to.equal("12345678é");
    expect(Buffer.byteLength(track(["€".repeat(500)]))).to.be.at.most(1000);
  });

  it("remembers a line when a later line is only whitespace", () => {
    expect(track(["real error\n", "   "])).to.equal("real error");
  });

  it("stays correct over many chunks", () => {
    const tracker = new LastLineTracker();
    for (let i = 0; i < 10_000; i++) tracker.push(Buffer.from(`line ${i}\n`));
    expect(tracker.line()).to.equal("line 9999");
  });

  it("makes the launcher's raw line bytes the same line, however many it sent", () => {
    const line = `  x${"é".repeat(600)}`;
    expect(lineFromBytes(Buffer.from(line))).to.equal(track([line]));
    expect(lineFromBytes(Buffer.from(line).subarray(0, 1000))).to.equal(`x${"é".repeat(498)}`);
    expect(lineFromBytes(Buffer.from(" \t "))).to.equal("");
  });

    it("capUtf8 cuts at a character boundary", () => {
    expect(capUtf8("aé", 2)).to.equal("a");
    expect(capUtf8("abc", 5)).to.equal("abc");
  });
});
