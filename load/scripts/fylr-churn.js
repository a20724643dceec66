// fylr-churn: many real fylrs (several per fylr-host process, each with its own database
// pools and broker connections) share one Postgres and three execservers while fylrs join
// and leave. The queue is kept topped up, so every fylr always has work to claim and how
// much each gets is decided by the claim share and the broker's round-robin alone.
//
// Scenarios:
//   feed     one VU until FEED_S: keeps at least BACKLOG items queued and not claimed
//            (GET /queued, then Submit to the anchor fylrs, which never leave), so no fylr
//            ever waits for work, however slowly the observer's ticks run on a busy machine
//   observe  one VU, a tick per second until the last window that fits before CHURN_S
//            has closed: finds the running fylrs (GET /fylrs on every host), reads every
//            fylr's Stats and closes a window every WINDOW_S after
//            WARMUP_S. In each window the fylrs present at both
//            ends (and already present at its start) are compared: claims in the window
//            against their mean (`window_max_deviation`).
//   crash    one VU: at CRASH_AT the crash host SIGKILLs itself (its fylrs go without a
//            goodbye; `rescue_ms` is how long until no item is still claimed by them)
//   join     JOIN_N VUs: at JOIN_AT and JOIN2_AT each starts a fylr on its stable host and
//            follows it (`newcomer_share_ms`: start → the newcomer holds its full
//            admission, taken from the HELLO of every execserver)
//   leave    one VU: at LEAVE_AT LEAVE_N fylrs stop gracefully
import { sleep } from 'k6';
import execution from 'k6/execution';
import http from 'k6/http';
import { Counter, Trend } from 'k6/metrics';
import { brokerClient, envInt, envString, getStatus } from './lib/broker.js';

const HOSTS = envString('HOST_ADDRS').split(',');
const CRASH_HOST = envString('CRASH_HOST');
const EXECSERVERS = envInt('EXECSERVERS', 3);
const WARMUP_S = envInt('WARMUP_S', 12);
const WINDOW_S = envInt('WINDOW_S', 15);
const CHURN_S = envInt('CHURN_S', 57);
// The windows that fit between WARMUP_S and CHURN_S; the observer stops once the last closed.
const WINDOWS = Math.floor((CHURN_S - WARMUP_S) / WINDOW_S);
const BACKLOG = envInt('BACKLOG', 150);
const CRASH_AT = envInt('CRASH_AT', 15);
const JOIN_AT = envInt('JOIN_AT', 20);
const LEAVE_AT = envInt('LEAVE_AT', 33);
const JOIN2_AT = envInt('JOIN2_AT', 37);
const JOIN_N = envInt('JOIN_N', 5);
const LEAVE_N = envInt('LEAVE_N', 5);
const JOB_S = __ENV.JOB_S || '0.5';
const MIN_FYLRS = envInt('MIN_FYLRS', 50);
const MAX_DEVIATION = Number(__ENV.MAX_DEVIATION || '0.25');
const MIN_WINDOW_CLAIMS = envInt('MIN_WINDOW_CLAIMS', 10);
const RESCUE_MS = envInt('RESCUE_MS', 10000);
const NEWCOMER_MS = envInt('NEWCOMER_MS', 3000);
// Past the second join's newcomers' bound, so they are measured against a fed queue.
const FEED_S = Math.max(CHURN_S, JOIN2_AT + Math.ceil(NEWCOMER_MS / 1000)) + 15;
const RUN = __ENV.RUN_ID || 'run';
const EXEC_ADDRS = (__ENV.EXEC_ADDRS || '').split(',').filter(Boolean);
const execClients = EXEC_ADDRS.map(() => brokerClient());
// Per-fylr grants, declines and parked wants from every execserver's GetStatus in the log.
const VERBOSE = __ENV.DIAG === '1';
const GREEDY = __ENV.GREEDY === '1';

const maxDeviation = new Trend('window_max_deviation');
const windowFylrs = new Trend('window_fylrs');
const windowClaimsMin = new Trend('window_claims_min');
const windows = new Counter('windows');
const present = new Trend('fylrs_present');
const submitted = new Counter('items_submitted');
const submitErrors = new Counter('submit_errors');
const statsErrors = new Counter('stats_errors');
const rescueMs = new Trend('rescue_ms');
const rescued = new Counter('rescued_items');
const newcomerMs = new Trend('newcomer_share_ms');
const newcomers = new Counter('newcomers');
const left = new Counter('fylrs_left');
const crashed = new Counter('fylrs_crashed');
const overShare = new Counter('window_over_share');

export const options = {
  setupTimeout: '180s',
  batch: 40,
  batchPerHost: 10,
  scenarios: {
    feed: { executor: 'per-vu-iterations', vus: 1, iterations: 1, maxDuration: `${FEED_S + 30}s`, exec: 'feed' },
    observe: { executor: 'per-vu-iterations', vus: 1, iterations: 1, maxDuration: `${CHURN_S + 30}s`, exec: 'observe' },
    crash: { executor: 'per-vu-iterations', vus: 1, iterations: 1, maxDuration: `${CHURN_S + 30}s`, exec: 'crash' },
    join: { executor: 'per-vu-iterations', vus: JOIN_N, iterations: 1, maxDuration: `${FEED_S + 30}s`, exec: 'join' },
    leave: { executor: 'per-vu-iterations', vus: 1, iterations: 1, maxDuration: `${CHURN_S + 30}s`, exec: 'leave' },
  },
  thresholds: {
    window_max_deviation: [`max<=${MAX_DEVIATION}`],
    windows: [`count>=${WINDOWS}`],
    window_fylrs: [`min>=${MIN_FYLRS - LEAVE_N}`],
    window_claims_min: [`min>=${MIN_WINDOW_CLAIMS}`],
    fylrs_present: [`min>=${MIN_FYLRS}`],
    rescue_ms: [`max<${RESCUE_MS}`],
    rescued_items: ['count>0'],
    newcomer_share_ms: [`max<${NEWCOMER_MS}`],
    newcomers: [`count>=${2 * JOIN_N}`],
    fylrs_left: [`count>=${LEAVE_N}`],
    fylrs_crashed: ['count>0'],
    submit_errors: ['count==0'],
    stats_errors: ['count==0'],
  },
  summaryTrendStats: ['min', 'med', 'p(95)', 'max', 'count'],
};

const json = { headers: { 'Content-Type': 'application/json' }, timeout: '10s' };

function queueCall(addr, method, body) {
  return { method: 'POST', url: `http://${addr}/slotbroker.v1.QueueService/${method}`, body: JSON.stringify(body), params: { ...json, tags: { method } } };
}

/** Every running fylr: id → {id, http, host}. A host that does not answer has none. */
function membership(hosts) {
  const responses = http.batch(hosts.map((h) => ({ method: 'GET', url: `http://${h}/fylrs`, params: { timeout: '5s', tags: { method: 'fylrs' } } })));
  const out = new Map();
  responses.forEach((r, i) => {
    if (r.status !== 200) return;
    for (const f of r.json()) out.set(f.id, { ...f, host: hosts[i] });
  });
  return out;
}

const elapsed = (t0) => (Date.now() - t0) / 1000;
const hostOf = new Map(); // fylr id → control address of its host (observer VU only)

/** The first fylr of each stable host: never asked to leave, so Submits go to them. */
function anchorsOf(fylrs) {
  return [...fylrs.values()].filter((f, i, all) => all.findIndex((g) => g.host === f.host) === i);
}

/** Submits items from..to-1 round-robin over `anchors`; returns how many were created. */
function submitItems(anchors, from, to) {
  const batch = [];
  for (let n = from; n < to; n++) {
    batch.push(queueCall(anchors[n % anchors.length].http, 'Submit', { calls: [{ service: 'sleep', args: [JOB_S] }], idempotencyKey: `${RUN}-${n}` }));
  }
  let created = 0;
  let responses = http.batch(batch);
  // A Submit that timed out on a starved host is sent once more: the idempotency key makes
  // the repeat return the item the first one may have created.
  const again = new Set(batch.map((_, i) => i).filter((i) => responses[i].status === 0));
  if (again.size > 0) {
    const retried = http.batch([...again].map((i) => ({ ...batch[i], params: { ...batch[i].params, timeout: '30s' } })));
    let k = 0;
    responses = responses.map((r, i) => (again.has(i) ? retried[k++] : r));
  }
  for (const [i, r] of responses.entries()) {
    if (r.status === 200 && (r.json('created') === true || again.has(i))) created++;
    else {
      submitErrors.add(1);
      console.error(`submit: ${r.status} ${r.body}`);
    }
  }
  submitted.add(created);
  return created;
}

// Before the clock starts every fylr's admission and BACKLOG more go in, so the first
// window is not spent filling the queue.
// Before that, every fylr must have the HELLOs that count all of them: a fylr whose HELLO
// still counted a few clients would claim a share several times too large, and then claim
// nothing until that surplus ran.
export function setup() {
  const t0 = Date.now();
  const deadline = t0 + 60000;
  for (;;) {
    // (The greedy fylr of SLOTBROKER_LOAD_BREAK=greedy has an admission of its own.)
    const fylrs = [...membership([...HOSTS, CRASH_HOST]).values()].filter((f) => !(GREEDY && f.id.startsWith('host-0-0-')));
    const admissions = new Set(fylrs.map((f) => (f.instances === EXECSERVERS ? f.admission : -1)));
    if (admissions.size === 1 && !admissions.has(-1)) break;
    if (Date.now() > deadline) throw new Error(`setup: fylrs still differ in admission after 60 s: ${[...admissions].join(', ')}`);
    sleep(0.2);
  }
  const settled = Date.now();
  const fylrs = [...membership([...HOSTS, CRASH_HOST]).values()];
  const n = fylrs.reduce((sum, f) => sum + f.admission, 0) + BACKLOG;
  submitItems(anchorsOf(membership(HOSTS)), 0, n);
  console.log(`setup: shares settled after ${settled - t0} ms, ${n} items submitted in ${Date.now() - settled} ms`);
  return { submitted: n };
}

export function feed(data) {
  const t0 = Date.now();
  const anchors = anchorsOf(membership(HOSTS));
  let next = data.submitted;
  let short = 0; // polls that found fewer than half of BACKLOG queued
  while (elapsed(t0) < FEED_S) {
    const r = http.get(`http://${HOSTS[0]}/queued`, { timeout: '10s', tags: { method: 'queued' } });
    // A failed count must not end the feed (the queue would run dry): say so and ask again.
    if (r.status !== 200) {
      console.error(`feed: queued: ${r.status} ${r.body}`);
      sleep(0.5);
      continue;
    }
    const queued = r.json('queued');
    if (queued < BACKLOG / 2) short++;
    if (queued < BACKLOG) {
      submitItems(anchors, next, next + BACKLOG - queued);
      next += BACKLOG - queued;
    } else sleep(0.2);
  }
  console.log(`feed: ${next} items submitted; ${short} polls found fewer than ${BACKLOG / 2} queued`);
}

export function observe() {
  const t0 = Date.now();
  const firstSeen = new Map(); // id → seconds since t0
  const last = new Map(); // id → its latest counters (kept after it left: its finished items count)
  let windowStart; // { at, fylrs: Map id → counters, exec }
  let nextWindow = WARMUP_S;
  let closed = 0;
  execClients.forEach((c, i) => c.connect(EXEC_ADDRS[i], { plaintext: true, timeout: '20s' }));
  // Until the last window has closed (a tick late under load, not a fixed margin later);
  // the scenario's maxDuration bounds it.
  while (closed < WINDOWS) {
    const tick = Date.now();
    // Every host answers with all its fylrs' counters taken at one instant.
    const fylrs = membership([...HOSTS, CRASH_HOST]);
    const now = elapsed(t0);
    for (const [id, f] of fylrs) {
      if (!firstSeen.has(id)) firstSeen.set(id, now);
      hostOf.set(id, f.host);
      last.set(id, f);
    }
    present.add(fylrs.size);

    if (now >= nextWindow) {
      let claims;
      if (windowStart) {
        checkStats(fylrs);
        claims = closeWindow(windowStart, now, fylrs, firstSeen);
        closed++;
      }
      windowStart = { at: now, fylrs, claims: claims || claimCounts(), exec: VERBOSE ? execGrants() : undefined };
      nextWindow += WINDOW_S;
    }

    if (VERBOSE) {
      const q = http.get(`http://${HOSTS[0]}/queued`, { timeout: '5s' });
      const held = [...fylrs.values()].reduce((n, f) => n + f.held, 0);
      let finished = 0;
      for (const f of last.values()) finished += f.succeeded + f.failed;
      console.log(`tick ${now.toFixed(1)} s: ${fylrs.size} fylrs, ${finished} finished, held ${held}, queued ${q.status === 200 ? q.json('queued') : '?'}, tick ${Date.now() - tick} ms`);
    }
    sleep(Math.max(0, 1 - (Date.now() - tick) / 1000));
  }
  console.log(`observe: ${firstSeen.size} fylrs seen`);
}

/** Every listed fylr answers Stats over QueueService (once a window). */
function checkStats(fylrs) {
  const list = [...fylrs.values()];
  http.batch(list.map((f) => queueCall(f.http, 'Stats', {}))).forEach((r, i) => {
    // A fylr may leave between the listing and its Stats: then it is not an error.
    if (r.status !== 200 && membership([list[i].host]).has(list[i].id)) statsErrors.add(1);
  });
}

/** Per client name: [grants, declines, connections, wantsParked, offers] per execserver. */
function execGrants() {
  const out = new Map();
  execClients.forEach((c, i) => {
    for (const conn of getStatus(c).connections) {
      const row = out.get(conn.clientName) || EXEC_ADDRS.map(() => [0, 0, 0, 0, 0]);
      row[i][0] += Number(conn.grants);
      row[i][1] += Number(conn.declines);
      row[i][2] += 1;
      row[i][3] += Number(conn.wantsParked);
      row[i][4] += Number(conn.offers);
      out.set(conn.clientName, row);
    }
  });
  return out;
}

// --verbose: per fylr, what its window's claims were made of.
function diagnose(start, deltas, end) {
  const exec = execGrants();
  const lines = [];
  for (const d of [...deltas].sort((a, b) => a.n - b.n)) {
    const a = start.exec.get(d.id);
    const b = exec.get(d.id);
    const s0 = start.fylrs.get(d.id);
    const s1 = end.get(d.id);
    const g = b ? b.map((r, i) => r[0] - (a ? a[i][0] : 0)) : [];
    const dec = b ? b.map((r, i) => r[1] - (a ? a[i][1] : 0)) : [];
    const parked = b ? b.map((r) => r[3]) : [];
    const offers = b ? b.map((r, i) => r[4] - (a ? a[i][4] : 0)) : [];
    lines.push(
      `${d.id} claims ${d.n} succ ${s1.succeeded - s0.succeeded} req ${s1.requeued - s0.requeued} held ${s0.held}→${s1.held}/${s1.admission} ` +
        `offers ${offers.join('/')} grants ${g.join('/')} declines ${dec.join('/')} parked ${parked.join('/')}`,
    );
  }
  console.log(`window diag:\n  ${lines.join('\n  ')}`);
}

/**
 * Claims per fylr id as Postgres recorded them (claimed_by, claimed_at) up to one cut-off:
 * every fylr counted at the same instant, whichever host answers late. An item claimed
 * again (rescued) counts for its last claimer only, which only ever costs departed fylrs.
 */
function claimCounts() {
  const r = http.get(`http://${HOSTS[0]}/claims`, { timeout: '10s', tags: { method: 'claims' } });
  if (r.status !== 200) throw new Error(`claims: ${r.status} ${r.body}`);
  return r.json('claims');
}

function closeWindow(start, endAt, end, firstSeen) {
  const endClaims = claimCounts();
  const deltas = [];
  const perHost = new Map();
  for (const [id, after] of end) {
    const before = start.fylrs.get(id);
    // Present at both ends and already connected to every execserver when the window
    // opened (a newcomer's first, partial window — its initial fill — would compare a part
    // with wholes).
    // A fylr holding more than its share at the start claims nothing until the surplus
    // ran: not comparable (setup() waits for settled shares, so this should not happen).
    if (before === undefined || firstSeen.get(id) > start.at || before.instances !== EXECSERVERS) continue;
    if (before.held > before.admission) {
      overShare.add(1);
      continue;
    }
    const n = (endClaims[id] || 0) - (start.claims[id] || 0);
    deltas.push({ id, n });
    perHost.set(hostOf.get(id), [...(perHost.get(hostOf.get(id)) || []), n]);
  }
  if (deltas.length === 0) return endClaims;
  const mean = deltas.reduce((a, d) => a + d.n, 0) / deltas.length;
  const worst = deltas.reduce((w, d) => (Math.abs(d.n - mean) / mean > Math.abs(w.n - mean) / mean ? d : w), deltas[0]);
  const deviation = mean > 0 ? Math.abs(worst.n - mean) / mean : 1;
  const ns = deltas.map((d) => d.n);
  if (VERBOSE && start.exec) diagnose(start, deltas, end);
  maxDeviation.add(deviation);
  windowFylrs.add(deltas.length);
  windowClaimsMin.add(Math.min(...ns));
  windows.add(1);
  console.log(
    `window ${start.at.toFixed(0)}–${endAt.toFixed(0)} s: ${deltas.length} fylrs, claims ${Math.min(...ns)}–${Math.max(...ns)} (mean ${mean.toFixed(1)}), ` +
      `max deviation ${(deviation * 100).toFixed(1)} % (${worst.id}); per host: ${[...perHost].map(([h, ns]) => `${h} [${ns.join(' ')}]`).join(', ')}`,
  );
  return endClaims;
}

function waitUntil(t0, at) {
  const wait = at - elapsed(t0);
  if (wait > 0) sleep(wait);
}

// One fylr starts on `host` and is followed until it holds its share. Each newcomer has a
// VU of its own: followed in one batch, every newcomer waited for the slowest start and
// the slowest Stats answer of the batch, which measured k6, not the newcomer.
function joinOne(t0, host) {
  const r = http.post(`http://${host}/join`, null, { timeout: '60s', tags: { method: 'join' } });
  if (r.status !== 200) throw new Error(`join on ${host}: ${r.status} ${r.body}`);
  newcomers.add(1);
  // From the moment startFylr returned: it is claiming, its broker connections opening.
  const f = r.json();
  let hellos;
  let firstHeld;
  for (;;) {
    const res = http.post(`http://${f.http}/slotbroker.v1.QueueService/Stats`, '{}', { ...json, tags: { method: 'Stats' } });
    const s = res.status === 200 ? res.json() : {};
    const shares = s.shares || [];
    const held = Number(s.execHeld || 0);
    const waited = Date.now() - f.returnedAt;
    // When its last HELLO and its first claim showed: which of the two a slow newcomer waited for.
    if (hellos === undefined && shares.length === EXECSERVERS) hellos = waited;
    if (firstHeld === undefined && held > 0) firstHeld = waited;
    // Its share: every execserver's HELLO seen and the admission they give all held.
    const full = shares.length === EXECSERVERS && Number(s.execAdmission || 0) > 0 && held >= Number(s.execAdmission || 0);
    if (full) {
      console.log(`newcomer ${f.id} at ${elapsed(t0).toFixed(1)} s: holds ${held}/${s.execAdmission} after ${waited} ms (start ${f.startedMs} ms; all HELLOs at ${hellos} ms, first claim at ${firstHeld} ms)`);
    } else if (waited > 30000) {
      console.error(`newcomer ${f.id}: no full share after 30 s: ${JSON.stringify(s)}`);
    } else {
      sleep(0.05);
      continue;
    }
    newcomerMs.add(waited);
    return;
  }
}

// JOIN_N VUs, each starting one fylr on its own stable host at JOIN_AT and one more at JOIN2_AT.
export function join() {
  const t0 = Date.now();
  const host = HOSTS[execution.scenario.iterationInTest % HOSTS.length];
  waitUntil(t0, JOIN_AT);
  joinOne(t0, host);
  waitUntil(t0, JOIN2_AT);
  joinOne(t0, host);
}

export function crash() {
  const t0 = Date.now();
  waitUntil(t0, CRASH_AT);
  const crash = http.post(`http://${CRASH_HOST}/crash`, null, { timeout: '5s' });
  if (crash.status !== 200) throw new Error(`crash: ${crash.status} ${crash.body}`);
  const ids = crash.json('crashing');
  crashed.add(ids.length);
  const crashAt = Date.now();
  const probe = `http://${HOSTS[0]}/held?ids=${ids.join(',')}`;
  sleep(0.2);
  const heldAtCrash = http.get(probe).json('held');
  for (;;) {
    const held = http.get(probe).json('held');
    if (held === 0) break;
    if (Date.now() - crashAt > 60000) break;
    sleep(0.1);
  }
  rescueMs.add(Date.now() - crashAt);
  rescued.add(heldAtCrash);
  console.log(`crash at ${CRASH_AT} s: ${ids.length} fylrs, ${heldAtCrash} items held, all rescued after ${Date.now() - crashAt} ms`);
}

export function leave() {
  const t0 = Date.now();
  waitUntil(t0, LEAVE_AT);
  // Never an anchor (the first fylr of each host): the feeder submits through those.
  const leaving = [...membership(HOSTS).values()].filter((f, i, all) => all.findIndex((g) => g.host === f.host) !== i).slice(0, LEAVE_N);
  for (const f of leaving) {
    const r = http.post(`http://${f.host}/leave?id=${f.id}`, null, { timeout: '30s' });
    if (r.status === 200) left.add(1);
    else console.error(`leave ${f.id}: ${r.status} ${r.body}`);
  }
}
