import type { Tone } from "./charts.js";

/** Each colour role's colour variable. A Record, so a new Tone without a colour does not compile. */
const toneColours: Record<Tone, string> = {
  running: "--running",
  offered: "--offered",
  free: "--free",
  queued: "--queued",
  claimed: "--claimed",
  reserved: "--queued",
  over: "--bad",
  legacy: "--legacy",
  token: "--legacy",
  ok: "--ok",
  warn: "--warn",
  bad: "--bad",
  muted: "--mute",
  accent: "--accent",
};

// `t-<tone>` colours boxes, bars, pills and chips; `tile-<tone>` a tile's top border.
const toneRules = Object.entries(toneColours)
  .map(([tone, colour]) => `.t-${tone},.tile-${tone}{--c:var(${colour})}`)
  .join("\n");

/** The status pages' stylesheet, inlined into every page (no external assets). */
export const pageStyle = `
:root{--bg:#f4f6f9;--card:#fff;--ink:#1c2230;--muted:#6b7383;--line:#e3e7ee;--track:#edf0f5;
--running:#3a6ee8;--offered:#f0a31b;--offered2:#f8c96c;--free:#c9d2df;--queued:#8a5cf6;--claimed:#14a39a;--legacy:#b4532a;--legacy2:#e8a27f;
--ok:#1f9d63;--warn:#e89a0c;--bad:#e0484e;--mute:#a3abb8;--accent:#3a6ee8;--shadow:0 1px 2px rgba(20,30,50,.06),0 2px 10px rgba(20,30,50,.05)}
@media (prefers-color-scheme:dark){:root{--bg:#12151b;--card:#1b2029;--ink:#e6e9ef;--muted:#98a1b2;--line:#2b3240;--track:#262d39;
--free:#46505f;--offered2:#9c6a13;--shadow:none}}
*{box-sizing:border-box}
html,body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px 24px 40px}
code{font:600 .95em ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:var(--track);padding:1px 6px;border-radius:5px}
h1{font-size:22px;margin:0 0 4px;font-weight:650;letter-spacing:-.01em}
h2{font-size:15px;margin:0 0 2px;font-weight:650}
h3{font-size:13px;margin:14px 0 6px;font-weight:600}
small,.detail,.note,.muted{color:var(--muted)}
.note{margin:0 0 12px;font-size:12.5px}
.top{display:flex;justify-content:space-between;align-items:flex-end;gap:16px;margin-bottom:14px}
.sub{display:flex;gap:10px;align-items:center;color:var(--muted)}
.banner{margin:0 0 14px;padding:10px 14px;border-radius:10px;background:var(--c);color:#fff;font-weight:600}
.live{position:fixed;top:14px;right:18px;display:flex;align-items:center;gap:7px;font-size:12px;color:var(--muted);
background:var(--card);padding:5px 11px;border-radius:20px;box-shadow:var(--shadow);border:1px solid var(--line)}
.live i{width:8px;height:8px;border-radius:50%;background:var(--mute)}
.live.ok i{background:var(--ok);box-shadow:0 0 0 3px rgba(31,157,99,.18)}
.live.stale{color:var(--bad)}.live.stale i{background:var(--bad)}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(440px,100%),1fr));gap:16px;align-items:start}
.grid>[data-section]{display:contents}
.card{background:var(--card);border:1px solid var(--line);border-radius:12px;padding:16px 18px;box-shadow:var(--shadow);min-width:0}
.card.wide{grid-column:1/-1}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(150px,100%),1fr));gap:12px;margin-bottom:16px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:12px;padding:12px 16px;box-shadow:var(--shadow);border-top:3px solid var(--c,var(--line))}
.tile-label{font-size:11.5px;text-transform:uppercase;letter-spacing:.05em;color:var(--muted);font-weight:600}
.tile-value{font-size:26px;font-weight:650;font-variant-numeric:tabular-nums;margin-top:2px}
.tile-value small{font-size:16px;font-weight:500}
.tile-hint{font-size:12px;color:var(--muted)}
${toneRules}
.legend{display:flex;gap:14px;font-size:12px;color:var(--muted);margin:0 0 8px}
.legend span{display:flex;align-items:center;gap:5px}.legend .box{width:12px;height:12px;margin:0}
.boxes{display:flex;flex-wrap:wrap;gap:5px;margin:6px 0}
.box{display:inline-block;width:22px;height:22px;border-radius:5px;background:var(--c)}
.boxes.dense{gap:3px}.boxes.dense .box{width:12px;height:12px;border-radius:3px}
.box.t-free{background:transparent;border:2px solid var(--free)}
.box.t-offered{background:repeating-linear-gradient(135deg,var(--offered) 0 4px,var(--offered2) 4px 8px)}
.box.t-reserved{background:transparent;border:2px dashed var(--queued)}
.box.t-token{background:repeating-linear-gradient(135deg,var(--legacy) 0 4px,var(--legacy2) 4px 8px)}
.box.t-over{background:repeating-linear-gradient(135deg,var(--bad) 0 4px,transparent 4px 8px);border:2px solid var(--bad)}
.wg{padding:10px 0;border-top:1px solid var(--line)}.wg:first-of-type{border-top:0}
.wg-head{display:flex;gap:10px;align-items:baseline}.wg-name{font-weight:650}
.wg-stats{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12.5px;color:var(--muted)}
.wg-stats b{color:var(--ink);font-variant-numeric:tabular-nums}
.bars{display:flex;flex-direction:column;gap:2px}
.bar-row{display:grid;grid-template-columns:minmax(110px,32%) 1fr minmax(64px,auto);gap:12px;align-items:center;padding:3px 0}
.bar-label{min-width:0;display:flex;flex-direction:column}
.bar-label .name,.bar-label .detail{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.bar-label .detail{font-size:11.5px}
.bar-track{position:relative;height:14px;background:var(--track);border-radius:7px;overflow:hidden}
.bar-fill{position:absolute;left:0;top:0;bottom:0;background:var(--c);border-radius:7px;min-width:0}
.bar-fill.thin{top:auto;height:4px;opacity:.9}
.bar-value{text-align:right;font-variant-numeric:tabular-nums;font-weight:600;white-space:nowrap}
.bar-value small{font-weight:400}
.stack{display:flex;height:14px;background:var(--track);border-radius:7px;overflow:hidden;flex:1;min-width:0}
.stack .seg{background:var(--c);height:100%}
.boxes.as-bar{display:block}
.fair{display:flex;gap:14px;align-items:center;margin:0 0 10px}
.fair p{margin:0;font-size:12.5px;color:var(--muted)}.fair b{color:var(--ink)}
.gauge-track{fill:none;stroke:var(--track);stroke-width:9}
.gauge-fill{fill:none;stroke:var(--c);stroke-width:9;stroke-linecap:round}
.gauge-text{font:650 17px system-ui,sans-serif;fill:var(--ink)}
.more{margin:8px 0 0;font-size:12.5px;color:var(--muted)}
.empty{color:var(--muted);font-style:italic;margin:6px 0}
button.cancel{font:inherit;font-size:12px;padding:1px 8px;border-radius:6px;border:1px solid var(--line,#ccc);background:transparent;color:inherit;cursor:pointer}button.cancel:disabled{opacity:.6;cursor:default}
.pill{display:inline-block;padding:1px 9px;border-radius:20px;background:var(--c);color:#fff;font-size:12px;font-weight:600;line-height:18px}
.table-wrap{overflow-x:auto}
table{width:100%;border-collapse:collapse;font-size:12.5px}
th{font-size:11px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted);font-weight:600;text-align:left;padding:6px 8px;border-bottom:1px solid var(--line)}
td{padding:5px 8px;border-bottom:1px solid var(--line);white-space:nowrap;max-width:260px;overflow:hidden;text-overflow:ellipsis}
tbody tr:hover{background:var(--track)}
.num{text-align:right;font-variant-numeric:tabular-nums}.zero{color:var(--mute)}
.more-row td{color:var(--muted);font-style:italic}
.chips{display:flex;flex-wrap:wrap;gap:8px;margin:6px 0 4px}
.chip{border:1px solid var(--line);border-left:4px solid var(--c);border-radius:8px;padding:6px 10px;font-size:12px;min-width:150px}
.chip b{display:block;font-size:12.5px}
.pool{padding:8px 0;border-top:1px solid var(--line)}.pool:first-of-type{border-top:0}
.rowline{display:flex;gap:10px;align-items:center;margin:4px 0}
.rowline .label{width:110px;flex:none;font-size:12.5px}
.rowline .count{width:70px;flex:none;text-align:right;font-variant-numeric:tabular-nums;font-weight:600}
@media (max-width:640px){main{padding:12px 12px 28px}.live{position:static;width:fit-content;margin:0 0 10px}
.tile-value{font-size:22px}.bar-row{grid-template-columns:minmax(90px,38%) 1fr auto;gap:8px}}
`;
