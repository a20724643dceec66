// deploy/kubernetes: valid against the Kubernetes API schemas (offline, strict), consistent
// with the configs they mount, and probing endpoints that behave as the probes assume — an
// execserver started from the ConfigMap leaves readiness at the first SIGTERM and stays live
// while it drains.
import { expect } from "chai";
import { execFile } from "node:child_process";
import { readFileSync, readdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { parse, parseAllDocuments } from "yaml";
import { compileFylrConfig, type FylrConfigInput } from "../../src/app/index.js";
import { compileExecserverConfig, type ExecserverConfigInput } from "../../src/execserver/index.js";
import { splitHostPort } from "../../src/shared/config.js";
import { spawnExecserver, stopExecserver } from "../support/execserver-process.js";
import { createTestDatabase } from "../support/postgres.js";
import { release } from "../support/resources.js";
import { BrokerStream, releaseAll } from "../execserver/support/broker-stream.js";
import { root, spawnFylr } from "../integration/support.js";

const dir = join(root, "deploy", "kubernetes");
const validator = join(root, "scripts", "kubernetes-validate.sh");

// The parts of the manifests this test reads.
interface Manifest {
  readonly kind: string;
  readonly metadata: { readonly name: string };
}
interface Probe {
  readonly httpGet: { readonly path: string; readonly port: string };
}
interface Container {
  readonly name: string;
  readonly args: string[];
  readonly env: { readonly name: string; readonly valueFrom?: { readonly secretKeyRef?: { readonly key: string } } }[];
  readonly ports: { readonly name: string; readonly containerPort: number }[];
  readonly readinessProbe: Probe;
  readonly livenessProbe: Probe;
}
interface Deployment extends Manifest {
  readonly spec: {
    readonly template: { readonly metadata: { readonly labels: Record<string, string> }; readonly spec: { readonly terminationGracePeriodSeconds: number; readonly containers: Container[] } };
  };
}
interface Service extends Manifest {
  readonly spec: { readonly selector: Record<string, string>; readonly ports: { readonly port: number; readonly targetPort: string }[] };
}

function manifests(): Manifest[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith(".yaml"))
    .flatMap((f) => parseAllDocuments(readFileSync(join(dir, f), "utf8")).map((d) => d.toJS() as Manifest));
}

function find<T extends Manifest>(kind: string, name: string): T {
  const doc = manifests().find((d) => d.kind === kind && d.metadata.name === name);
  if (!doc) throw new Error(`no ${kind} ${name} in deploy/kubernetes`);
  return doc as T;
}

function validate(files: string[]): Promise<{ code: number; out: string }> {
  return promisify(execFile)(validator, files, { timeout: 280_000 }).then(
    (r) => ({ code: 0, out: r.stdout + r.stderr }),
    (e: { code?: number; stdout?: string; stderr?: string }) => ({ code: e.code ?? 1, out: `${e.stdout ?? ""}${e.stderr ?? ""}` }),
  );
}

function container(deployment: Deployment): Container {
  return deployment.spec.template.spec.containers[0]!;
}

function portNumber(c: Container, name: string): number {
  const port = c.ports.find((p) => p.name === name);
  if (!port) throw new Error(`container ${c.name} has no port named ${name}`);
  return port.containerPort;
}

describe("deploy/kubernetes", function () {
  this.timeout(300_000);
  const secret = (): Record<string, string> => find<Manifest & { stringData: Record<string, string> }>("Secret", "slotbroker-secrets").stringData;
  const configFile = (key: string): unknown => parse(find<Manifest & { data: Record<string, string> }>("ConfigMap", "slotbroker-config").data[key]!);
  const deployment = (name: string): Deployment => find<Deployment>("Deployment", name);
  // The ConfigMap's execserver config on free loopback ports (the test helper picks them).
  const execConfig = (): Omit<ExecserverConfigInput, "listen" | "adminListen"> => {
    const { listen: _l, adminListen: _a, ...rest } = configFile("execserver.yaml") as ExecserverConfigInput;
    return rest;
  };

  it("validates against the Kubernetes 1.30 API schemas (strict), and the validator catches a broken manifest", async () => {
    const files = readdirSync(dir)
      .filter((f) => f.endsWith(".yaml"))
      .map((f) => join(dir, f));
    const good = await validate(files);
    expect(good.code, good.out).to.equal(0);
    const temp = mkdtempSync(join(tmpdir(), "slotbroker-k8s-"));
    try {
      const broken = join(temp, "execserver.yaml");
      writeFileSync(broken, readFileSync(join(dir, "execserver.yaml"), "utf8").replace("terminationGracePeriodSeconds: 45", 'terminationGracePeriodSeconds: "45s"'));
      const bad = await validate([broken]);
      expect(bad.code).to.not.equal(0);
      expect(bad.out).to.match(/terminationGracePeriodSeconds: '45s' is not of type 'integer'/);
      const typo = join(temp, "fylr.yaml");
      writeFileSync(typo, readFileSync(join(dir, "fylr.yaml"), "utf8").replace("readinessProbe:", "readinesProbe:"));
      expect((await validate([typo])).out).to.match(/'readinesProbe' was unexpected/);
    } finally {
      rmSync(temp, { recursive: true, force: true });
    }
  });

  it("mounts configs that compile, wires ports, secrets and the Service consistently, and outlasts the drain", () => {
    const env = { ...secret(), SLOTBROKER_INSTANCE_ID: "pod-1", SLOTBROKER_FYLR_NAME: "pod-2" };
    const exec = compileExecserverConfig(configFile("execserver.yaml"), "ConfigMap execserver.yaml", env);
    const fylr = compileFylrConfig(configFile("fylr.yaml"), "ConfigMap fylr.yaml", env);

    const execDeployment = deployment("slotbroker-execserver");
    const execContainer = container(execDeployment);
    expect(execContainer.args).to.deep.equal(["execserver", "--config", "/etc/slotbroker/execserver.yaml"]);
    expect(portNumber(execContainer, "grpc")).to.equal(splitHostPort(exec.listen)!.port);
    expect(portNumber(execContainer, "admin")).to.equal(splitHostPort(exec.adminListen)!.port);
    expect(execContainer.readinessProbe.httpGet).to.deep.equal({ path: "/healthz", port: "admin" });
    expect(execContainer.livenessProbe.httpGet).to.deep.equal({ path: "/livez", port: "admin" });
    expect(execDeployment.spec.template.spec.terminationGracePeriodSeconds * 1000).to.be.above(exec.drainTimeoutMs + 5000);

    const service = find<Service>("Service", "slotbroker-execserver");
    expect(service.spec.selector).to.deep.equal(execDeployment.spec.template.metadata.labels);
    expect(service.spec.ports[0]!.targetPort).to.equal("grpc");
    expect(fylr.broker.addresses).to.deep.equal([`${service.metadata.name}:${service.spec.ports[0]!.port}`]);
    // listen is 0.0.0.0: the API's tokens come from the Secret, or the fylr would not start.
    expect(fylr.auth?.tokens.map((t) => t.name)).to.deep.equal(["admin"]);

    const fylrDeployment = deployment("slotbroker-fylr");
    const fylrContainer = container(fylrDeployment);
    expect(fylrContainer.args).to.deep.equal(["fylr", "--config", "/etc/slotbroker/fylr.yaml"]);
    expect(portNumber(fylrContainer, "http")).to.equal(splitHostPort(fylr.listen)!.port);
    expect(fylrContainer.readinessProbe.httpGet).to.deep.equal({ path: "/healthz", port: "http" });
    expect(fylrContainer.livenessProbe.httpGet).to.deep.equal({ path: "/livez", port: "http" });
    expect(fylrDeployment.spec.template.spec.terminationGracePeriodSeconds * 1000).to.be.above(fylr.dispatcher.stopGraceMs + 5000);
    expect(find<Service>("Service", "slotbroker-fylr").spec.selector).to.deep.equal(fylrDeployment.spec.template.metadata.labels);

    // Every secret a container reads exists; the token and the database come from it.
    for (const c of [execContainer, fylrContainer]) {
      for (const e of c.env) {
        const ref = e.valueFrom?.secretKeyRef;
        if (ref) expect(secret(), `${c.name} ${e.name}`).to.have.property(ref.key);
      }
    }
  });

  describe("probes against real servers started from the ConfigMap", () => {
    let stdin: Server | undefined;
    let release_: ServerResponse | undefined;
    afterEach(async () => {
      release_?.end();
      await releaseAll();
      await new Promise((resolve) => (stdin ? stdin.close(resolve) : resolve(undefined)));
    });

    it("execserver: ready and live; from SIGTERM not ready but live until its job is done", async () => {
      const token = secret().SLOTBROKER_TOKEN!;
      const exec = await spawnExecserver({ ...execConfig(), token });
      const probe = async (path: string): Promise<number> => (await fetch(`http://${exec.adminAddress}${path}`)).status;
      const readiness = container(deployment("slotbroker-execserver")).readinessProbe.httpGet.path;
      const liveness = container(deployment("slotbroker-execserver")).livenessProbe.httpGet.path;
      expect([await probe(readiness), await probe(liveness)]).to.deep.equal([200, 200]);

      // A job whose stdin never ends keeps the drain going.
      let started!: () => void;
      const streaming = new Promise<void>((resolve) => (started = resolve));
      stdin = createServer((_req, res) => {
        res.writeHead(200);
        res.write("part of the input\n");
        release_ = res;
        started();
      });
      await new Promise<void>((resolve) => stdin!.listen(0, "127.0.0.1", resolve));
      const stream = await BrokerStream.open(exec.grpcAddress, { token });
      stream.want("j1", "sha256sum");
      const offer = await stream.next("offer");
      stream.job("j1", offer.offerToken, { stdinUrl: `http://127.0.0.1:${(stdin.address() as { port: number }).port}/in` });
      await streaming;

      exec.child.kill("SIGTERM");
      await stream.next("hello"); // the draining HELLO
      expect([await probe(readiness), await probe(liveness)]).to.deep.equal([503, 200]);
      release_!.end();
      expect((await stream.next("done")).receipt?.exitCode).to.equal(0);
      await new Promise((resolve) => exec.child.once("exit", resolve));
      expect(exec.child.exitCode).to.equal(0);
      await stopExecserver(exec);
    });

    it("fylr: ready and live once its dispatcher runs", async () => {
      const exec = await spawnExecserver(execConfig());
      const input = configFile("fylr.yaml") as FylrConfigInput;
      const fylr = await spawnFylr({ ...input, listen: "127.0.0.1:0", databaseUrl: await createTestDatabase("k8s"), execserver: { ...input.execserver, addresses: [exec.grpcAddress] } });
      const c = container(deployment("slotbroker-fylr"));
      for (const path of [c.readinessProbe.httpGet.path, c.livenessProbe.httpGet.path]) {
        expect((await fetch(`${fylr.url}${path}`)).status, path).to.equal(200);
      }
      expect(await fylr.stop()).to.equal(0);
      await release(fylr);
      await stopExecserver(exec);
    });
  });
});
