// deploy/kubernetes: valid against the Kubernetes API schemas (offline, strict), allowed by
// Pod Security "restricted" (the PodSecurity admission's own checks), hardened as a
// cluster expects (probes, resources, disruption budgets, network policies, spread),
// consistent with the configs they mount and the Secrets the operator guide creates, and
// probing endpoints that behave as the probes assume — servers started from the ConfigMap
// speak mutual TLS with certificates made by openssl, an execserver leaves readiness at the
// first SIGTERM and stays live while it drains.
import { expect } from "chai";
import { execFile } from "node:child_process";
import { copyFileSync, mkdirSync, readFileSync, readdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { parse, parseAllDocuments } from "yaml";
import { ItemState } from "../../../gen/slotbroker/v1/queue_pb.js";
import { compileFylrConfig, type FylrConfigInput } from "../../../src/app/index.js";
import { compileExecserverConfig, type ExecserverConfigInput } from "../../../src/execserver/index.js";
import { splitHostPort } from "../../../src/shared/config-parsing.js";
import { requireTool } from "../../../harness/system-tools.js";
import { spawnExecserver, stopExecserver, waitFor } from "../../../harness/execserver-process.js";
import { inState, watchUntil } from "../../support/watch-item.js";
import { createTestDatabase } from "../../support/postgres.js";
import { release } from "../../../harness/resources.js";
import { BrokerStream, releaseAll } from "../../execserver/support/broker-stream.js";
import { root, spawnFylr } from "../../integration/support.js";

const dir = join(root, "deploy", "kubernetes");
const validator = join(root, "scripts", "kubernetes-validate.sh");
const podSecurity = join(root, "scripts", "pod-security-check.sh");
const guide = readFileSync(join(root, "docs", "operator-guide.md"), "utf8");

// The parts of the manifests this test reads.
interface Manifest {
  readonly kind: string;
  readonly metadata: { readonly name: string };
}
interface Probe {
  readonly httpGet: { readonly path: string; readonly port: string };
  readonly periodSeconds?: number;
  readonly failureThreshold?: number;
}
interface Container {
  readonly name: string;
  readonly image: string;
  readonly args: string[];
  readonly env: { readonly name: string; readonly valueFrom?: { readonly secretKeyRef?: { readonly name: string; readonly key: string } } }[];
  readonly ports: { readonly name: string; readonly containerPort: number }[];
  readonly readinessProbe: Probe;
  readonly livenessProbe: Probe;
  readonly startupProbe?: Probe;
  readonly resources: { readonly requests?: Record<string, string>; readonly limits?: Record<string, string> };
  readonly volumeMounts: { readonly name: string; readonly mountPath: string }[];
}
interface PodSpec {
  readonly terminationGracePeriodSeconds: number;
  readonly containers: Container[];
  readonly topologySpreadConstraints?: { readonly topologyKey: string }[];
  readonly volumes: { readonly name: string; readonly emptyDir?: object; readonly secret?: { readonly secretName: string } }[];
}
interface Deployment extends Manifest {
  readonly spec: {
    readonly selector: { readonly matchLabels: Record<string, string> };
    readonly template: { readonly metadata: { readonly labels: Record<string, string> }; readonly spec: PodSpec };
  };
}
interface Selecting extends Manifest {
  readonly spec: { readonly selector?: { readonly matchLabels: Record<string, string> }; readonly podSelector?: { readonly matchLabels: Record<string, string> } };
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

function validate(files: string[], script = validator): Promise<{ code: number; out: string }> {
  return promisify(execFile)(script, files, { timeout: 280_000 }).then(
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

/** Secret name → the keys the operator guide's `kubectl create secret generic` commands put in it. */
function guideSecrets(): Map<string, Set<string>> {
  const secrets = new Map<string, Set<string>>();
  for (const [command] of guide.matchAll(/kubectl create secret generic (?:[^\n\\]|\\\n)*/g)) {
    const name = /generic (\S+)/.exec(command)![1]!;
    const keys = [...command.matchAll(/--from-(?:literal|file)=([A-Za-z0-9_.-]+)=/g)].map((m) => m[1]!);
    secrets.set(name, new Set(keys));
  }
  return secrets;
}

/** Copies of the manifests in a temp dir, with `edit` applied to `file`. */
function edited(temp: string, file: string, edit: (text: string) => string): string {
  const path = join(temp, file);
  const text = readFileSync(join(dir, file), "utf8");
  const changed = edit(text);
  if (changed === text) throw new Error(`the edit of ${file} changed nothing`);
  writeFileSync(path, changed);
  return path;
}

describe("deploy/kubernetes", function () {
  this.timeout(300_000);
  // The token the test servers share (the real one comes from the Secret the guide creates).
  const token = "test-token-from-the-secret";
  const secretEnv = {
    SLOTBROKER_TOKEN: token,
    SLOTBROKER_API_TOKENS: JSON.stringify([{ name: "admin", token: "test-api-token-from-the-secret", scopes: ["admin"] }]),
    DATABASE_URL: "postgres://slotbroker@postgres:5432/slotbroker",
  };
  // A ConfigMap config; `tlsDir` stands in for the Secret volume at /etc/slotbroker/tls.
  const configFile = (key: string, tlsDir?: string): unknown => {
    const text = find<Manifest & { data: Record<string, string> }>("ConfigMap", "slotbroker-config").data[key]!;
    return parse(tlsDir ? text.replaceAll("/etc/slotbroker/tls/", `${tlsDir}/`) : text);
  };
  const deployment = (name: string): Deployment => find<Deployment>("Deployment", name);
  // The ConfigMap's execserver config on free loopback ports (the test helper picks them).
  const execConfig = (tlsDir: string): Omit<ExecserverConfigInput, "listen" | "adminListen"> => {
    const { listen: _l, adminListen: _a, ...rest } = configFile("execserver.yaml", tlsDir) as ExecserverConfigInput;
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

  it("meets Pod Security \"restricted\" (the PodSecurity admission's checks), and the check catches pods that do not", async () => {
    const files = readdirSync(dir)
      .filter((f) => f.endsWith(".yaml"))
      .map((f) => join(dir, f));
    const good = await validate(files, podSecurity);
    expect(good.code, good.out).to.equal(0);
    expect(good.out).to.match(/^2 pod template\(s\) meet Pod Security "restricted"/m);
    const temp = mkdtempSync(join(tmpdir(), "slotbroker-psa-"));
    try {
      const cases: [string, (text: string) => string, RegExp][] = [
        ["execserver.yaml", (t) => t.replace(/\n {8}seccompProfile:\n {10}type: RuntimeDefault/, ""), /Deployment\/slotbroker-execserver: seccompProfile: .*"RuntimeDefault" or "Localhost"/],
        ["fylr.yaml", (t) => t.replace("allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true"), /Deployment\/slotbroker-fylr: allowPrivilegeEscalation != false/],
        ["fylr.yaml", (t) => t.replace("drop: [ALL]", "drop: [NET_RAW]"), /Deployment\/slotbroker-fylr: unrestricted capabilities/],
        ["execserver.yaml", (t) => t.replace(/\n {8}runAsNonRoot: true\n {8}runAsUser: 1000/, "\n        runAsUser: 0"), /runAsUser=0/],
      ];
      for (const [file, edit, message] of cases) {
        const bad = await validate([edited(temp, file, edit)], podSecurity);
        expect(bad.code, bad.out).to.equal(1);
        expect(bad.out).to.match(message);
      }
    } finally {
      rmSync(temp, { recursive: true, force: true });
    }
  });

  it("is hardened: one image, startup probes, patient readiness, resources, /tmp, spread, disruption budgets, network policies, no Secret", () => {
    const image = /docker build -f deploy\/Dockerfile -t (\S+) \./.exec(guide)?.[1];
    expect(image, "the guide's docker build").to.be.a("string");
    expect(manifests().filter((m) => m.kind === "Secret"), "a Secret applied with the ConfigMap").to.deep.equal([]);
    for (const name of ["slotbroker-execserver", "slotbroker-fylr"]) {
      const d = deployment(name);
      const pod = d.spec.template.spec;
      const c = container(d);
      expect(c.image, name).to.equal(image);
      expect(c.startupProbe?.httpGet.path, `${name} startupProbe`).to.equal("/livez");
      expect(c.readinessProbe.failureThreshold, `${name} readiness failureThreshold`).to.be.at.least(2);
      for (const kind of ["requests", "limits"] as const) expect(c.resources[kind], `${name} resources.${kind}`).to.include.all.keys("cpu", "memory");
      const tmp = c.volumeMounts.find((m) => m.mountPath === "/tmp");
      expect(pod.volumes.find((v) => v.name === tmp?.name)?.emptyDir, `${name}: an emptyDir at /tmp`).to.be.an("object");
      expect(pod.topologySpreadConstraints?.map((t) => t.topologyKey), `${name} topology spread`).to.include("kubernetes.io/hostname");
      for (const kind of ["PodDisruptionBudget", "NetworkPolicy"]) {
        const selector = find<Selecting>(kind, name).spec;
        expect(selector.selector?.matchLabels ?? selector.podSelector?.matchLabels, `${kind} ${name}`).to.deep.equal(d.spec.selector.matchLabels);
      }
    }
  });

  it("mounts configs that compile, wires ports, secrets and the Service consistently, and outlasts the drain", () => {
    const env = { ...secretEnv, SLOTBROKER_INSTANCE_ID: "pod-1", SLOTBROKER_FYLR_NAME: "pod-2" };
    const exec = compileExecserverConfig(configFile("execserver.yaml"), "ConfigMap execserver.yaml", env);
    const fylr = compileFylrConfig(configFile("fylr.yaml"), "ConfigMap fylr.yaml", env);

    const execDeployment = deployment("slotbroker-execserver");
    const execContainer = container(execDeployment);
    expect(execContainer.args).to.deep.equal(["execserver", "--config", "/etc/slotbroker/execserver.yaml"]);
    expect(portNumber(execContainer, "grpc")).to.equal(splitHostPort(exec.listen)!.port);
    expect(portNumber(execContainer, "admin")).to.equal(splitHostPort(exec.adminListen)!.port);
    expect(execContainer.readinessProbe.httpGet).to.deep.equal({ path: "/readyz", port: "admin" });
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
    expect(fylrContainer.readinessProbe.httpGet).to.deep.equal({ path: "/readyz", port: "http" });
    expect(fylrContainer.livenessProbe.httpGet).to.deep.equal({ path: "/livez", port: "http" });
    expect(fylrDeployment.spec.template.spec.terminationGracePeriodSeconds * 1000).to.be.above(fylr.dispatcher.stopGraceMs + 5000);
    expect(find<Service>("Service", "slotbroker-fylr").spec.selector).to.deep.equal(fylrDeployment.spec.template.metadata.labels);

    // Mutual TLS: both sides read their files from the Secret volume at /etc/slotbroker/tls.
    expect(exec.tls).to.deep.equal({ certFile: "/etc/slotbroker/tls/tls.crt", keyFile: "/etc/slotbroker/tls/tls.key", clientCaFile: "/etc/slotbroker/tls/ca.crt" });
    expect(fylr.broker.tls).to.deep.include({ caFile: "/etc/slotbroker/tls/ca.crt", certFile: "/etc/slotbroker/tls/tls.crt", keyFile: "/etc/slotbroker/tls/tls.key" });

    // Every Secret a pod reads, and every key of it, is one the operator guide creates.
    const created = guideSecrets();
    for (const d of [execDeployment, fylrDeployment]) {
      const c = container(d);
      for (const e of c.env) {
        const ref = e.valueFrom?.secretKeyRef;
        if (ref) expect([...(created.get(ref.name) ?? [])], `${c.name} ${e.name}: kubectl create secret generic ${ref.name} in the guide`).to.include(ref.key);
      }
      for (const v of d.spec.template.spec.volumes) {
        if (v.secret) expect([...(created.get(v.secret.secretName) ?? [])], `${c.name} volume ${v.name}`).to.include.members(["tls.crt", "tls.key", "ca.crt"]);
      }
    }
  });

  describe("probes against real servers started from the ConfigMap, over mutual TLS", () => {
    let stdin: Server | undefined;
    let release_: ServerResponse | undefined;
    let certs: string;
    // The two Secret volumes, as cert-manager (or kubectl create secret) fills them.
    let execTls: string;
    let fylrTls: string;
    // The certificates come from the guide's own openssl commands.
    before(async () => {
      certs = mkdtempSync(join(tmpdir(), "slotbroker-k8s-tls-"));
      const block = /```sh\n(openssl req -x509[^]*?)```/.exec(guide)?.[1];
      if (!block) throw new Error("no openssl block in the guide's Kubernetes section");
      const commands = block.replaceAll("\\\n", " ").split("\n").filter((line) => line.startsWith("openssl "));
      expect(commands.length).to.be.at.least(5);
      requireTool("openssl");
      await promisify(execFile)("bash", ["-euo", "pipefail", "-c", commands.join("\n").replaceAll("NAMESPACE", "default")], { cwd: certs });
      const volume = (name: string, leaf: string): string => {
        const volumeDir = join(certs, name);
        mkdirSync(volumeDir);
        copyFileSync(join(certs, `${leaf}.crt`), join(volumeDir, "tls.crt"));
        copyFileSync(join(certs, `${leaf}.key`), join(volumeDir, "tls.key"));
        copyFileSync(join(certs, "ca.crt"), join(volumeDir, "ca.crt"));
        return volumeDir;
      };
      execTls = volume("execserver-tls", "execserver");
      fylrTls = volume("fylr-tls", "fylr");
    });
    after(() => certs && rmSync(certs, { recursive: true, force: true }));
    afterEach(async () => {
      release_?.end();
      await releaseAll();
      await new Promise((resolve) => (stdin ? stdin.close(resolve) : resolve(undefined)));
    });

    it("execserver: ready and live; from SIGTERM not ready but live until its job is done", async () => {
      const exec = await spawnExecserver({ ...execConfig(execTls), token });
      const probe = async (path: string): Promise<number> => (await fetch(`http://${exec.adminAddress}${path}`)).status;
      const c = container(deployment("slotbroker-execserver"));
      const [readiness, liveness, startup] = [c.readinessProbe.httpGet.path, c.livenessProbe.httpGet.path, c.startupProbe!.httpGet.path];
      expect([await probe(readiness), await probe(liveness), await probe(startup)]).to.deep.equal([200, 200, 200]);

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
      const credentials = grpc.credentials.createSsl(readFileSync(join(fylrTls, "ca.crt")), readFileSync(join(fylrTls, "tls.key")), readFileSync(join(fylrTls, "tls.crt")));
      // The certificate names the Service; the test dials its loopback address.
      const stream = await BrokerStream.open(exec.grpcAddress, { token, credentials, channelOptions: { "grpc.ssl_target_name_override": "slotbroker-execserver" } });
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

    it("fylr: live at once, ready once its execserver is connected over mutual TLS; runs an item", async () => {
      const exec = await spawnExecserver({ ...execConfig(execTls), token });
      const input = configFile("fylr.yaml", fylrTls) as FylrConfigInput;
      const fylr = await spawnFylr({
        ...input,
        listen: "127.0.0.1:0",
        databaseUrl: await createTestDatabase("k8s"),
        // The certificate names the Service; the test dials its loopback address.
        execserver: { ...input.execserver, addresses: [exec.grpcAddress], token, tls: { ...input.execserver.tls, serverName: "slotbroker-execserver" } },
      });
      const c = container(deployment("slotbroker-fylr"));
      for (const path of [c.startupProbe!.httpGet.path, c.livenessProbe.httpGet.path]) {
        expect((await fetch(`${fylr.url}${path}`)).status, path).to.equal(200);
      }
      await waitFor(`${c.readinessProbe.httpGet.path} 200`, async () => (await fetch(`${fylr.url}${c.readinessProbe.httpGet.path}`)).status === 200);
      const { item } = await fylr.client.submit({ calls: [{ service: "sha256sum", stdin: { case: "stdinData", value: Buffer.from("k8s\n") } }] });
      const done = await watchUntil(fylr.client, item!.id, "the item done", inState(ItemState.SUCCEEDED, ItemState.FAILED));
      expect(done.item!.state, done.item!.error).to.equal(ItemState.SUCCEEDED);
      expect(await fylr.stop()).to.equal(0);
      await release(fylr);
      await stopExecserver(exec);
    });
  });
});
