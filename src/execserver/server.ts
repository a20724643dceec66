import { performance } from "node:perf_hooks";
import { create, toBinary } from "@bufbuild/protobuf";
import type * as grpc from "@grpc/grpc-js";
import {
  HelloSchema,
  type ConnectRequest,
  type ConnectResponse,
  type GetStatusResponse,
  type Hello,
} from "../../gen/slotbroker/v1/broker_pb.js";
import { AbortReason } from "../shared/abort.js";
import { Events } from "../shared/typed-events.js";
import { isLoopbackHost, splitHostPort } from "../shared/config-parsing.js";
import { Code, ConfigError, SlotbrokerError } from "../shared/errors.js";
import { toGrpcError, type HealthService } from "../shared/grpc.js";
import { Transitions } from "../shared/lifecycle.js";
import { LogBudget, type Logger } from "../shared/log.js";
import { AdminServer } from "./admin-server.js";
import { BearerAuth } from "./auth.js";
import { BrokerCore } from "./broker-core.js";
import type { ExecserverConfig } from "./config.js";
import { BrokerIo } from "./effects.js";
import { logExecserverEvents, type ExecserverEvents, type ExecserverState } from "./events.js";
import { GrpcDoor, createGrpcServer, healthServices } from "./grpc-door.js";
import { HelloBroadcast } from "./hello-broadcast.js";
import { IdleWaiters } from "./idle-waiters.js";
import { LegacyTokens, LegacyTransport } from "./legacy/index.js";
import { ExecserverMetrics } from "./metrics.js";
import { createRunJob, jobDirRoot, jobDirsRemoved, nativeLauncherPath, readPipeCa, sharedJobLauncher, sweepLeftoverJobs, type RunJob } from "./runner/index.js";
import { Session, type SessionHost } from "./session.js";
import { buildStatus, helloWaitgroups } from "./status-snapshot.js";

export type { ExecserverState };
export { healthServices };

const transitions = new Transitions<ExecserverState>("execserver", {
  created: ["serving", "stopped"],
  serving: ["draining", "stopped"],
  draining: ["stopped"],
  stopped: [],
});

/** Optional parts of an execserver. */
export interface ExecserverOptions {
  readonly logger: Logger;
  /** Runs command services; default: the process runner. */
  readonly runJob?: RunJob;
  /** How long Hello changes are gathered before one broadcast (default 100 ms; bounds the Hello fan-out that connection churn can cause). */
  readonly helloCoalesceMs?: number;
  /**
   * HELLO frames per second a run of changes may cost at most (default 2,000): the window
   * grows with the streams, from helloCoalesceMs (up to 200 streams) to 5 s at 10,000.
   */
  readonly helloFramesPerSecond?: number;
  /** After the drain timeout aborts jobs, how long to wait for their receipts (default 10 s). */
  readonly abortWaitMs?: number;
}

const capabilities = ["query", "position-eta", "offer-expired", "half-close", "cancel", "stdin-inline", "fairness-keys"];

/**
 * One execserver: the gRPC server (BrokerService, health, reflection), the admin HTTP
 * listener and the broker core, with a checked lifecycle and graceful/forceful shutdown.
 */
export class Execserver implements SessionHost {
  /** Lifecycle events: connections, offers and their outcomes, jobs, state. */
  readonly events: Events<ExecserverEvents>;
  readonly broker: BrokerCore;
  readonly metrics: ExecserverMetrics;
  readonly admin: AdminServer;
  /** The token protocol for pre-broker clients; undefined when config.legacy is off. */
  readonly legacy: LegacyTransport | undefined;
  readonly startedAt = new Date();
  private stateValue: ExecserverState = "created";
  private readonly io: BrokerIo;
  private readonly grpcServer: grpc.Server;
  private readonly health: HealthService;
  private readonly auth: BearerAuth;
  private readonly sessions = new Set<Session>();
  // Aborted when the server stops; every session listens and ends its stream.
  private readonly shutdown = new AbortController();
  private readonly services: Record<string, string> = {};
  private readonly serviceEnv: Record<string, { names: string[] }> = {};
  private readonly logger: Logger;
  // Refused connections are logged, but a client retrying with a wrong token cannot flood the log.
  private readonly refusedLog = new LogBudget(10, 10_000);
  private readonly helloBroadcast: HelloBroadcast;
  private readonly idle = new IdleWaiters(() => this.broker.running);
  private nextConnectionId = 0;
  private closing: Promise<void> | undefined;
  private forcing: Promise<void> | undefined;
  // The token protocol's own listener, when it is not on the admin port.
  private readonly legacyServer: AdminServer | undefined;
  // The gRPC port's listener (grpc-js gets its connections from it); undefined before start.
  private grpcDoor: GrpcDoor | undefined;
  /** Bound gRPC port; 0 in legacy-only mode. */
  grpcPort = 0;
  adminPort = 0;
  /** Port serving the token protocol (the admin port when it shares it); 0 when off. */
  legacyPort = 0;

  constructor(
    readonly config: ExecserverConfig,
    private readonly options: ExecserverOptions,
  ) {
    this.logger = options.logger.child({ component: "execserver", instanceId: config.instanceId });
    // One listener for every session (they add none of their own: see Session.start).
    this.shutdown.signal.addEventListener("abort", () => this.closeSessions("execserver stopped"), { once: true });
    this.helloBroadcast = new HelloBroadcast(
      {
        streams: () => this.sessions.size,
        stopped: () => this.stateValue === "stopped",
        broadcast: () => {
          const shared = this.sharedHello();
          for (const session of this.sessions) session.sendHello(shared);
        },
      },
      { coalesceMs: options.helloCoalesceMs, framesPerSecond: options.helloFramesPerSecond },
    );
    for (const [name, s] of Object.entries(config.services)) {
      this.services[name] = s.waitgroup;
      this.serviceEnv[name] = { names: [...s.env] };
    }
    this.events = new Events((err, event) => this.logger.error({ err, event }, "an execserver event listener threw"));
    // Jobs start through the job launcher (Linux only) with `jobLauncher: true`, and with
    // "auto" when the native one is built; otherwise they fork here.
    const launcher = process.platform === "linux" && (config.jobLauncher === true || (config.jobLauncher === "auto" && nativeLauncherPath() !== undefined));
    const runJob = options.runJob ?? (launcher ? createRunJob({ launcher: sharedJobLauncher() }) : undefined);
    this.io = new BrokerIo({
      events: this.events,
      instanceId: config.instanceId,
      offerTimeoutMs: config.offerTimeoutMs,
      cancelGraceMs: config.cancelGraceMs,
      logger: this.logger,
      runJob,
      pipeCa: config.pipeCaFile === undefined ? undefined : readPipeCa(config.pipeCaFile),
      now: () => this.now(),
      jobFinished: () => this.idle.jobFinished(),
    });
    this.broker = new BrokerCore({ ...config, now: () => this.now() }, this.io);
    const tokens = config.legacy && new LegacyTokens(this.broker, { ttlMs: config.legacy.tokenTtlMs, now: () => this.now() });
    this.metrics = new ExecserverMetrics(this.broker, config.instanceId, this.events, () => this.now(), tokens);
    logExecserverEvents(this.events, this.logger);
    this.io.attach(this.broker);
    this.auth = new BearerAuth(config.token);
    ({ server: this.grpcServer, health: this.health } = createGrpcServer({
      connect: (call) => this.onConnect(call),
      getStatus: (call, callback) => this.onGetStatus(call, callback),
    }));
    this.admin = new AdminServer(this.logger, { auth: this.auth, limits: config.adminHttp });
    if (config.legacy && tokens) {
      this.legacy = new LegacyTransport({
        tokens,
        instanceId: config.instanceId,
        ttlMs: config.legacy.tokenTtlMs,
        auth: this.auth,
        events: this.events,
        logger: this.logger.child({ component: "legacy" }),
        runJob,
        jobFinished: () => this.idle.jobFinished(),
      });
      const target = config.legacy.listen === "admin" ? this.admin : (this.legacyServer = new AdminServer(this.logger, { auth: this.auth, limits: config.adminHttp }));
      const handler = (req: Parameters<LegacyTransport["handle"]>[0], res: Parameters<LegacyTransport["handle"]>[1]): Promise<void> | void =>
        this.legacy!.handle(req, res);
      target.route("/job", handler).routePrefix("/token/", handler);
    }
  }

  /** Where the lifecycle stands. */
  get state(): ExecserverState {
    return this.stateValue;
  }

  /** @inheritdoc */
  get helloVersion(): number {
    return this.helloBroadcast.version;
  }

  /** Binds the gRPC and admin listeners. */
  async start(): Promise<void> {
    const { host } = splitHostPort(this.config.listen) ?? {};
    if (host === undefined) throw new ConfigError(`listen: expected "host:port", got "${this.config.listen}"`);
    if (!this.config.token && !isLoopbackHost(host)) {
      throw new ConfigError(`token: required when listen (${this.config.listen}) is not a loopback address`);
    }
    // What dead execservers left goes before a listener is bound, so before any slot is
    // offered: a restarted execserver never runs its jobs beside orphans of the last one.
    if (!this.options.runJob) await sweepLeftoverJobs(jobDirRoot(undefined), this.logger);
    try {
      if (this.config.brokerService) {
        const { listen, tls, handshakeTimeoutMs } = this.config;
        this.grpcDoor = await GrpcDoor.open(this.grpcServer, { listen, tls, handshakeTimeoutMs, logger: this.logger });
        this.grpcPort = this.grpcDoor.port;
      }
      this.adminPort = await this.admin.listen(this.config.adminListen);
      const legacyListen = this.config.legacy?.listen;
      if (legacyListen === "admin") this.legacyPort = this.adminPort;
      else if (legacyListen) this.legacyPort = await this.legacyServer!.listen(legacyListen === "listen" ? this.config.listen : legacyListen);
    } catch (err) {
      this.grpcDoor?.close();
      this.grpcServer.forceShutdown();
      await this.admin.close();
      await this.legacyServer?.close();
      this.setState("stopped");
      throw err instanceof SlotbrokerError ? err : SlotbrokerError.from(err);
    }
    this.setState("serving");
  }

  /** The current Hello as the peer at `peerAddress` would get it. */
  hello(peerAddress: string): Hello {
    return create(HelloSchema, {
      instanceId: this.config.instanceId,
      services: this.services,
      serviceEnv: this.serviceEnv,
      waitgroups: helloWaitgroups(this.broker),
      clients: this.sessions.size,
      capabilities,
      peerAddress,
      draining: this.broker.draining,
    });
  }

  /** @inheritdoc */
  sharedHello(): Uint8Array {
    return toBinary(HelloSchema, this.hello(""));
  }

  /** @inheritdoc */
  now(): number {
    return performance.now();
  }

  /** @inheritdoc */
  frameReceived(kind: string): void {
    this.metrics.frameReceived(kind);
  }

  /** @inheritdoc */
  closed(session: Session, reason: string): void {
    if (!this.sessions.delete(session)) return;
    this.helloBroadcast.changed();
    this.events.emit("connection:down", session.connection, reason);
  }

  /** The GetStatus snapshot. */
  status(): GetStatusResponse {
    return buildStatus(this.broker, this.config.instanceId, this.services, this.startedAt, this.legacy?.tokens);
  }

  /**
   * Graceful shutdown: stop granting, announce draining, let running jobs finish within
   * drainTimeout, then abort what is left, report it, and stop listening. Idempotent.
   */
  close(): Promise<void> {
    this.closing ??= this.drainAndStop();
    return this.closing;
  }

  /** Forceful shutdown: abort every job, drop every stream, stop at once. Idempotent. */
  forceClose(): Promise<void> {
    this.forcing ??= this.stopNow();
    return this.forcing;
  }

  private async drainAndStop(): Promise<void> {
    if (this.stateValue === "created") return this.setState("stopped");
    if (this.stateValue === "stopped") return;
    this.setState("draining");
    this.broker.drain();
    for (const service of healthServices) this.health.setStatus(service, "NOT_SERVING");
    this.helloBroadcast.changed();
    this.helloBroadcast.flush();
    this.logger.info({ running: this.broker.running, drainTimeoutMs: this.config.drainTimeoutMs }, "draining");
    if (!(await this.idle.wait(this.config.drainTimeoutMs))) {
      this.logger.warn({ running: this.broker.running }, "drain timeout: aborting running jobs");
      for (const record of this.broker.runningRecords) this.io.abortForShutdown(record);
      this.legacy?.abortAll("execserver shut down before the job finished");
      if (!(await this.idle.wait(this.options.abortWaitMs ?? 10_000))) {
        this.logger.error({ running: this.broker.running }, "aborted jobs did not report; stopping anyway");
      }
    }
    // forceClose() may have finished the job while we waited.
    if (this.state === "stopped") return;
    this.shutdown.abort(new AbortReason("shutdown", "execserver stopped"));
    this.grpcDoor?.close();
    await new Promise<void>((resolve) => {
      const force = setTimeout(() => {
        this.grpcServer.forceShutdown();
        resolve();
      }, 2_000);
      this.grpcServer.tryShutdown(() => {
        clearTimeout(force);
        resolve();
      });
    });
    await this.admin.close();
    await this.legacyServer?.close();
    await jobDirsRemoved(); // finished jobs' directories go after their DONE
    this.finalStop();
  }

  private async stopNow(): Promise<void> {
    if (this.stateValue === "stopped") return;
    this.broker.drain();
    for (const record of this.broker.runningRecords) this.io.abortForShutdown(record);
    this.legacy?.abortAll("execserver force-closed");
    this.shutdown.abort(new AbortReason("shutdown", "execserver force-closed"));
    this.grpcDoor?.close();
    this.grpcServer.forceShutdown();
    await this.admin.close();
    await this.legacyServer?.close();
    this.finalStop();
  }

  private finalStop(): void {
    this.io.stop();
    this.legacy?.stop();
    this.helloBroadcast.cancel();
    this.idle.releaseAll();
    if (this.stateValue !== "stopped") this.setState("stopped");
  }

  private setState(next: ExecserverState): void {
    const previous = this.stateValue;
    this.stateValue = transitions.check(previous, next);
    this.events.emit("state", next, previous);
  }

  private onConnect(call: grpc.ServerDuplexStream<ConnectRequest, ConnectResponse>): void {
    try {
      if (!this.auth.check(call.metadata)) {
        const left = this.refusedLog.take();
        if (left !== undefined) this.logger.warn({ peer: call.getPeer(), notLogged: left || undefined }, "refused a connection: missing or wrong bearer token");
        call.emit("error", toGrpcError(new SlotbrokerError(Code.Unauthenticated, "missing or wrong bearer token")));
        return;
      }
      if (this.stateValue !== "serving" && this.stateValue !== "draining") {
        call.emit("error", toGrpcError(new SlotbrokerError(Code.Unavailable, "execserver is shutting down")));
        return;
      }
      const id = `c${++this.nextConnectionId}`;
      const session = new Session(call, this, id, this.logger.child({ component: "session", conn: id }), this.shutdown.signal);
      this.sessions.add(session);
      // The newcomer's own Hello already counts it; everyone else hears about it shortly.
      this.helloBroadcast.changed();
      session.start();
      if (this.sessions.has(session)) this.events.emit("connection:up", session.connection);
    } catch (err) {
      this.logger.error({ err }, "connect handler failed");
      call.emit("error", toGrpcError(err));
    }
  }

  private onGetStatus(call: grpc.ServerUnaryCall<unknown, GetStatusResponse>, callback: grpc.sendUnaryData<GetStatusResponse>): void {
    try {
      if (!this.auth.check(call.metadata)) {
        callback(toGrpcError(new SlotbrokerError(Code.Unauthenticated, "missing or wrong bearer token")));
        return;
      }
      callback(null, this.status());
    } catch (err) {
      this.logger.error({ err }, "GetStatus failed");
      callback(toGrpcError(err));
    }
  }

  /** How long Hello changes are gathered before the next broadcast. */
  helloWindowMs(): number {
    return this.helloBroadcast.windowMs();
  }

  private closeSessions(reason: string): void {
    for (const session of [...this.sessions]) session.close(reason);
  }
}
