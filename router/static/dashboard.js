// kvemu dashboard: polls /dashboard/data every second and draws it with uPlot (vendored).
// Every panel records what it drew in data-points (values drawn, or table rows) for tests.
"use strict";

const POLL_MS = 1000;
// Okabe-Ito: distinct for colour-blind readers; replicas past 7 get evenly spaced hues.
const REPLICA_COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000"];
// cluster-wide series (reasons, imbalance kinds): hues no replica line uses
const OTHER_COLORS = ["#6a3d9a", "#8c564b", "#444444", "#e7298a", "#a6761d", "#999933", "#17becf"];
const clock = (unixS) => new Date(unixS * 1000).toLocaleTimeString([], {hour12: false});
// /dashboard?sessions=raw#token=T: session ids as sent, asked for with the cluster token, which is kept in this
// tab only (sessionStorage) and taken out of the address bar, so it is in no URL sent, logged or shared.
const RAW = new URLSearchParams(location.search).get("sessions") === "raw";
const TOKEN_KEY = "kvemu-cluster-token";
let rawSessions = RAW;
const charts = {};
const replicaColor = {};
let lastOk = 0;

function colorFor(rid) {
  if (!(rid in replicaColor)) {
    const n = Object.keys(replicaColor).length;
    replicaColor[rid] = n < REPLICA_COLORS.length ? REPLICA_COLORS[n] : `hsl(${(n * 137) % 360},65%,40%)`;
  }
  return replicaColor[rid];
}

function panel(name) { return document.querySelector(`[data-panel="${name}"]`); }

function fmt(v, digits = 2) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "K";
  return Number.isInteger(v) ? String(v) : v.toFixed(digits);
}

function countValues(data) {
  let n = 0;
  for (let i = 1; i < data.length; i++) for (const v of data[i]) if (v !== null && v !== undefined) n++;
  return n;
}

// ---- charts ------------------------------------------------------------------------------
// spec: {x: {log, labels}, y: {label, range}, series: [{label, color, dash}]}; data: [xs, ys...]
function draw(name, spec, data) {
  const p = panel(name);
  const box = p.querySelector(".chart");
  const key = JSON.stringify(spec);
  let c = charts[name];
  if (c && c.key !== key) { c.plot.destroy(); c = null; }
  if (!c) {
    c = {key, plot: new uPlot(options(spec, box), data, box), colors: spec.series.map((s) => s.color)};
    charts[name] = c;
  } else {
    c.plot.setData(data);
  }
  p.dataset.points = String(countValues(data));
}

function options(spec, box) {
  const xs = spec.x || {};
  const axisX = {label: xs.label || "time (h:mm:ss)", size: 44};
  if (xs.labels) {
    // every bucket gets a tick; labels thin out so they never overlap, the last ("first use") always shown
    const step = () => Math.max(1, Math.ceil(xs.labels.length * 40 / Math.max(box.clientWidth - 80, 40)));
    axisX.splits = () => xs.labels.map((_, i) => i);
    axisX.values = (u, ticks) => ticks.map((t) => (t % step() === 0 || t === xs.labels.length - 1 ? xs.labels[t] : ""));
  } else if (xs.log) {
    axisX.values = (u, ticks) => ticks.map((t) => (Number.isInteger(Math.log10(t)) ? fmt(t) : ""));
  } else {
    axisX.space = 80;
    axisX.values = (u, ticks) => ticks.map(clock);
  }
  const series = [{label: xs.label || "time"}].concat(spec.series.map((s) => ({
    label: s.label, stroke: s.color, width: 2, dash: s.dash, spanGaps: !!xs.log,
    points: {show: !!s.points, size: 5, fill: s.color}, value: (u, v) => fmt(v, 3),
  })));
  const scaleX = xs.labels || xs.log ? {time: false, distr: xs.log ? 3 : 1} : {time: true};
  const top = spec.y.top ?? 1;  // an all-zero series still gets a readable axis
  const scaleY = spec.y.range ? {range: spec.y.range} : {range: (u, lo, hi) => [0, Math.max(hi || 0, top) * 1.08]};
  const axisY = {label: spec.y.label, size: 56, values: (u, ticks) => ticks.map((t) => fmt(t, 2))};
  if (spec.y.integer) axisY.incrs = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 1e4, 2e4, 5e4, 1e5, 1e6];
  return {
    width: Math.max(box.clientWidth, 240), height: 200, series, legend: {live: false},
    scales: {x: scaleX, y: scaleY}, cursor: {drag: {x: false, y: false}}, axes: [axisX, axisY],
  };
}

function perReplica(d, key, scale = 1) {
  const ids = Object.keys(d.history.replicas);
  return {
    series: ids.map((rid) => ({label: label(d, rid), color: colorFor(rid)})),
    data: [d.history.t].concat(ids.map((rid) => d.history.replicas[rid][key].map((v) => (v === null ? null : v * scale)))),
  };
}

function label(d, rid) {
  const row = d.replicas.find((r) => r.replica_id === rid);
  return row && !row.healthy ? `${rid} (down)` : rid;
}

function timeCharts(d) {
  const simple = [["kv_usage", "kv_usage", {label: "KV usage (%)", range: [0, 100]}, 100],
    ["hit_ratio", "hit_ratio", {label: "block hit ratio (HBM)", range: [0, 1]}, 1], ["csr", "csr", {label: "CSR", range: [0, 1]}, 1],
    ["running", "running", {label: "requests", integer: true}, 1], ["waiting", "waiting", {label: "requests", integer: true}, 1],
    ["evictions", "evictions_per_s", {label: "blocks / s"}, 1], ["index_lag", "event_lag", {label: "events", integer: true}, 1]];
  for (const [name, key, y, scale] of simple) {
    const {series, data} = perReplica(d, key, scale);
    draw(name, {y, series}, data);
  }
  const p50 = perReplica(d, "ttft_p50_s");
  const p99 = perReplica(d, "ttft_p99_s");
  const series = p50.series.map((s) => ({...s, label: s.label + " p50"}))
    .concat(p99.series.map((s) => ({...s, label: s.label + " p99", dash: [6, 4]})));
  draw("ttft", {y: {label: "seconds (emulated)", top: 0.01}, series}, p50.data.concat(p99.data.slice(1)));
}

function clusterCharts(d) {
  const h = d.history;
  const reasons = Object.keys(h.decisions_per_s);
  draw("decisions", {y: {label: "decisions / s"}, series: reasons.map((r, i) => ({
    label: `${r} (${fmt(d.decisions[r] || 0)} total)`, color: OTHER_COLORS[i % OTHER_COLORS.length]}))},
  [h.t].concat(reasons.map((r) => h.decisions_per_s[r])));
  const imb = [["in flight", "imbalance_in_flight"], ["KV usage", "imbalance_kv_usage"], ["routed", "imbalance_routed"]];
  draw("imbalance", {y: {label: "max / mean"}, series: imb.map(([l], i) => ({label: l, color: OTHER_COLORS[i]}))},
    [h.t].concat(imb.map(([, k]) => h.cluster[k])));
  draw("hotspots", {y: {label: "replicas", integer: true}, series: [{label: "hotspots flagged", color: OTHER_COLORS[2]}]},
    [h.t, h.cluster.hotspots]);
  const backend = d.index.backend || "index";
  draw("index_size", {y: {label: "entries", integer: true}, series: [{label: `${backend} index entries`, color: OTHER_COLORS[0]}]},
    [h.t, h.cluster.index_entries]);
  document.getElementById("hotspot-factor").textContent = d.hotspot_factor;
  const list = document.getElementById("hotspot-list");
  const hot = d.replicas.filter((r) => r.hotspot);
  list.replaceChildren(...(hot.length ? hot.map((r) => li(`${r.replica_id}: ${r.hotspot_reasons.join(", ")}`))
    : [li("none flagged now")]));
}

function li(text) { const e = document.createElement("li"); e.textContent = text; return e; }

function mrcChart(d) {
  const rows = d.replicas.filter((r) => r.stats && r.stats.mrc.length);
  if (!rows.length) return draw("mrc", {x: {log: true, label: "capacity (blocks)"}, y: {label: "hit ratio", range: [0, 1]}, series: []}, [[]]);
  const data = uPlot.join(rows.map((r) => [r.stats.mrc.map((p) => p[0]), r.stats.mrc.map((p) => p[1])]));
  draw("mrc", {x: {log: true, label: "capacity (blocks)"}, y: {label: "hit ratio", range: [0, 1]},
    series: rows.map((r) => ({label: label(d, r.replica_id), color: colorFor(r.replica_id)}))}, data);
}

function reuseChart(d) {
  const rows = d.replicas.filter((r) => r.stats && r.stats.reuse_accesses);
  let top = 0;
  for (const r of rows) for (const [k] of r.stats.reuse_distance_log2.buckets || []) top = Math.max(top, k + 1);
  const labels = ["0"].concat(Array.from({length: top}, (_, k) => fmt(2 ** k, 0)), ["first"]);
  const xs = labels.map((_, i) => i);
  const series = rows.map((r) => {
    const h = r.stats.reuse_distance_log2;
    const ys = xs.map(() => 0);
    ys[0] = h.zero || 0;
    for (const [k, c] of h.buckets || []) ys[k + 1] = c;
    ys[labels.length - 1] = h.inf || 0;
    const total = ys.reduce((a, b) => a + b, 0) || 1;
    return ys.map((v) => v / total);
  });
  draw("reuse", {x: {labels, label: "reuse distance (blocks, ≥)"}, y: {label: "share of accesses"},
    series: rows.map((r) => ({label: label(d, r.replica_id), color: colorFor(r.replica_id), points: true}))},
  [xs].concat(series));
}

// ---- tables ------------------------------------------------------------------------------
function cell(text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; }

function badge(text, cls) {
  const td = cell("", "text status");
  const b = document.createElement("span");
  b.className = "badge " + (cls || "");
  b.textContent = text;
  td.appendChild(b);
  return td;
}

function replicaTable(d) {
  const rows = d.replicas.map((r) => {
    const s = r.stats || {};
    const last = (key) => { const arr = (d.history.replicas[r.replica_id] || {})[key] || []; return arr[arr.length - 1]; };
    const tr = document.createElement("tr");
    tr.dataset.replica = r.replica_id;
    tr.className = r.healthy ? "up" : "down";
    const name = cell(r.replica_id, "text");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = r.replica_id in replicaColor ? replicaColor[r.replica_id] : "#bbbbbb";
    name.prepend(sw);
    const ttft = s.ttft ? `${fmt(s.ttft.p50_s, 3)} / ${fmt(s.ttft.p99_s, 3)}` : "–";
    tr.append(name, badge(r.healthy ? "up" : "down", r.healthy ? "" : "down"), cell(s.policy || "–", "text"),
      cell(s.capacity_blocks ? `${fmt(s.capacity_blocks)} blocks` : "–"), cell(fmt(r.kv_usage * 100, 1) + "%"),
      cell(fmt(s.block_hit_ratio, 3)), cell(fmt(s.csr, 3)), cell(fmt(r.healthy ? r.running : null)),
      cell(fmt(r.healthy ? r.waiting : null)), cell(ttft), cell(fmt(r.healthy ? last("evictions_per_s") : null, 1)),
      cell(fmt(r.event_lag)), r.hotspot ? badge(r.hotspot_reasons.join(", "), "hot") : cell("no", "text"));
    return tr;
  });
  fillTable("replicas", rows);
}

function fillTable(name, rows) {
  document.querySelector(`#${name} tbody`).replaceChildren(...rows);
  panel(name).dataset.points = String(rows.length);
}

function sessionsTable(d) {
  const rows = [];
  for (const r of d.replicas) {
    for (const s of (r.stats && r.stats.top_sessions) || []) {
      const tr = document.createElement("tr");
      const share = r.stats.capacity_blocks ? (100 * s.blocks / r.stats.capacity_blocks).toFixed(1) + "%" : "–";
      tr.append(cell(r.replica_id, "text"), cell(s.session === null ? "(none)" : String(s.session), "text"),
        cell(fmt(s.blocks)), cell(share));
      rows.push(tr);
    }
  }
  fillTable("top_sessions", rows);
}

function switchesTable(d) {
  const rows = [];
  for (const r of d.replicas) {
    for (const s of (r.stats && r.stats.policy_switches) || []) {
      const tr = document.createElement("tr");
      tr.append(cell(clock(s.at), "text"), cell(r.replica_id, "text"),
        cell(s.from, "text"), cell(s.to, "text"));
      rows.push(tr);
    }
  }
  panel("policy_switches").hidden = rows.length === 0;
  fillTable("policy_switches", rows);
}

// ---- P/D: a panel per pool and one for the transfer link (hidden in a colocated cluster) ----------------
function pdPanels(d) {
  const pd = d.pd;
  panel("pd_pools").hidden = !pd;
  panel("pd_link").hidden = !pd;
  if (!pd) return;
  document.getElementById("pd-decider").textContent = pd.decider;
  document.getElementById("pd-paths").textContent = "Requests: " +
    Object.entries(pd.paths).map(([k, v]) => `${fmt(v)} ${k}`).join(", ") + ".";
  const rows = [];
  for (const [pool, ids] of Object.entries(pd.pools)) {
    if (!ids.length) continue;
    const reps = d.replicas.filter((r) => ids.includes(r.replica_id));
    const up = reps.filter((r) => r.healthy);
    const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);
    const ttft = up.map((r) => (r.stats && r.stats.ttft ? r.stats.ttft.p50_s : null)).filter((v) => v !== null);
    const decided = pd.decisions[pool === "prefill" ? "prefill" : "decode"] || {};
    const tr = document.createElement("tr");
    tr.dataset.pool = pool;
    tr.append(cell(pool === "both" ? "colocated" : pool, "text"), cell(ids.join(", "), "text"), cell(`${up.length} / ${reps.length}`),
      cell(fmt(up.reduce((a, r) => a + (r.running || 0), 0))), cell(fmt(up.reduce((a, r) => a + (r.waiting || 0), 0))),
      cell(fmt(mean(up.map((r) => r.kv_usage * 100)), 1) + "%"), cell(fmt(ttft.length ? Math.max(...ttft) : null, 3)),
      cell(pool === "both" ? "(decode pool's)" : Object.entries(decided).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") || "–", "text"));
    rows.push(tr);
  }
  fillTable("pd_pools", rows);
  const ids = Object.keys(d.history.replicas).filter((rid) => {
    const row = d.replicas.find((r) => r.replica_id === rid);
    return row && row.role !== "both";
  });
  draw("pd_link", {y: {label: "bytes / s"}, series: ids.map((rid) => ({label: label(d, rid), color: colorFor(rid)}))},
    [d.history.t].concat(ids.map((rid) => d.history.replicas[rid].link_bytes_per_s)));
  const links = d.replicas.filter((r) => r.role !== "both").map((r) => {
    const p = (r.stats && r.stats.pd) || {};
    const send = p.send || {}, recv = p.recv || {};
    const pct = (v) => (v === undefined || v === null ? "–" : fmt(v * 100, 2) + "%");
    const failovers = Object.values(p.failovers || {}).reduce((a, b) => a + b, 0);
    const tr = document.createElement("tr");
    tr.dataset.replica = r.replica_id;
    tr.append(cell(r.replica_id, "text"), cell(r.role, "text"), cell(fmt(send.bytes) + " B"), cell(fmt(send.transfers)),
      cell(pct(send.utilization)), cell(fmt(recv.bytes) + " B"), cell(fmt(recv.transfers)), cell(pct(recv.utilization)),
      cell(fmt(p.held_requests)), cell(fmt(failovers)));
    return tr;
  });
  document.querySelector("#pd_link tbody").replaceChildren(...links);
}

// ---- shared KV stores: occupancy over time, bytes held, the link, and a table (hidden without one) ------------
function storePanels(d) {
  const stores = d.shared_stores || [];
  for (const name of ["shared_stores", "shared_store_bytes", "shared_store_link"]) panel(name).hidden = !stores.length;
  if (!stores.length) return;
  const hist = d.history.stores || {};
  const ids = Object.keys(hist);
  const color = (i) => OTHER_COLORS[i % OTHER_COLORS.length];
  const series = (key, scale) => [d.history.t].concat(ids.map((pid) => hist[pid][key].map((v) => (v === null ? null : v * scale))));
  draw("shared_stores", {y: {label: "occupancy (%)", range: [0, 100]}, series: ids.map((pid, i) => ({label: pid, color: color(i)}))},
    series("occupancy", 100));
  draw("shared_store_bytes", {y: {label: "GiB", top: 0.01}, series: ids.map((pid, i) => ({label: pid, color: color(i)}))},
    series("used_bytes", 1 / 2 ** 30));
  draw("shared_store_link", {y: {label: "bytes / s"}, series: ids.map((pid, i) => ({label: pid, color: color(i)}))},
    series("link_bytes_per_s", 1));
  const rows = stores.map((p) => {
    const tr = document.createElement("tr");
    tr.dataset.store = p.store_id;
    const hits = Object.entries(p.hits_by_level || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") || "–";
    const held = p.used_blocks === null || p.used_blocks === undefined ? "–"
      : `${fmt(p.used_blocks)} / ${fmt(p.blocks)} blocks` + (p.used_bytes ? ` (${fmt(p.used_bytes / 2 ** 30, 2)} GiB)` : "");
    tr.append(cell(p.store_id, "text"), badge(p.healthy ? "up" : "down", p.healthy ? "" : "down"),
      cell(Array.isArray(p.serves) ? p.serves.join(", ") : "every replica", "text"),
      cell(p.occupancy === null ? "–" : fmt(p.occupancy * 100, 1) + "%"), cell(held), cell(fmt(p.chunks)),
      cell(fmt(p.writes)), cell(fmt(p.refused_writes)), cell(fmt(p.reads)), cell(fmt(p.evictions)), cell(hits, "text"),
      cell(fmt(p.event_lag)));
    return tr;
  });
  document.querySelector("#shared_stores_table tbody").replaceChildren(...rows);
  panel("shared_stores").dataset.rows = String(rows.length);
}

// ---- agent sessions: sessions in flight and their fan-out as the router sees it (requests of one session at once)
function agentPanel(d) {
  const h = d.history.cluster;
  const lines = [["sessions in flight", "sessions_in_flight"], ["fanned out (> 1 request at once)", "sessions_fanned_out"],
    ["widest fan-out (requests at once)", "widest_fanout"]];
  draw("agent_sessions", {y: {label: "sessions / requests", integer: true},
    series: lines.map(([l], i) => ({label: l, color: OTHER_COLORS[[0, 3, 6][i]], dash: i === 2 ? [6, 4] : undefined}))},
  [d.history.t].concat(lines.map(([, k]) => h[k])));
  const a = d.agent_sessions || {top: []};
  const rows = a.top.map((s) => {
    const tr = document.createElement("tr");
    tr.append(cell(s.session === null ? "(none)" : String(s.session), "text"), cell(fmt(s.in_flight)), cell(fmt(s.widest)),
      cell(fmt(s.for_s, 1)));
    return tr;
  });
  document.querySelector("#agent_sessions tbody").replaceChildren(...rows);
  panel("agent_sessions").dataset.rows = String(rows.length);
}

function header(d) {
  const up = d.replicas.filter((r) => r.healthy).length;
  const s = (d.replicas.find((r) => r.stats) || {}).stats || {};
  const model = s.model ? `, ${s.model} on ${s.gpu}` : "";
  document.getElementById("summary").textContent =
    `${up} of ${d.replicas.length} replicas up, ${d.routing} routing, ${d.index.backend || "?"} index${model}`;
  const upd = document.getElementById("updated");
  upd.textContent = `updated ${clock(d.now)} (${d.history.t.length} samples every ${d.interval_s} s)`;
  upd.dataset.samples = String(d.history.t.length);
  upd.dataset.now = String(d.now);
  upd.classList.remove("stale");
}

function render(d) {
  for (const rid of Object.keys(d.history.replicas)) colorFor(rid);  // never-seen replicas (URL ids) get none
  header(d);
  replicaTable(d);
  pdPanels(d);
  storePanels(d);
  timeCharts(d);
  clusterCharts(d);
  agentPanel(d);
  mrcChart(d);
  reuseChart(d);
  sessionsTable(d);
  switchesTable(d);
}

function clusterToken() {
  const m = location.hash.match(/(?:^#|&)token=([^&]*)/);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function fetchData() {
  if (!rawSessions) return fetch("/dashboard/data", {cache: "no-store"});
  const resp = await fetch("/dashboard/data?sessions=raw",
    {cache: "no-store", headers: {Authorization: `Bearer ${clusterToken()}`}});
  const note = document.getElementById("sessions-note");
  if (resp.status === 401 || resp.status === 403) {  // no token, or not this cluster's: hashed ids, and why
    rawSessions = false;
    note.textContent = `Raw session ids refused (${resp.status}): open /dashboard?sessions=raw#token=TOKEN with this`
      + " cluster's token (the file kvemu up prints beside token). Showing keyed hashes.";
    return fetchData();
  }
  note.textContent = "Session ids as sent (asked with the cluster token).";
  return resp;
}

async function tick() {
  try {
    const resp = await fetchData();
    if (resp.ok) { render(await resp.json()); lastOk = Date.now(); }
  } catch (e) {
    // the router is unreachable: say so below, keep polling
  }
  if (lastOk && Date.now() - lastOk > 3 * POLL_MS) {
    const upd = document.getElementById("updated");
    upd.textContent = "router not answering; last data at " + clock(lastOk / 1000);
    upd.classList.add("stale");
  }
  setTimeout(tick, POLL_MS);
}

window.addEventListener("resize", () => {
  for (const c of Object.values(charts)) {
    const box = c.plot.root.parentElement;
    c.plot.setSize({width: Math.max(box.clientWidth, 240), height: 200});
  }
});

window.kvemuDashboard = {charts};  // for tests and the curious: the uPlot instances by panel
// The page comes with the data of its moment (the router inlines it, session ids hashed): drawn now, before
// the load event, so a screenshot taken at load has it; polling takes over from there.
const first = JSON.parse(document.getElementById("first-data").textContent);
if (first && !RAW) { render(first); lastOk = Date.now(); }
setTimeout(tick, first && !RAW ? POLL_MS : 0);
