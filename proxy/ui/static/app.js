// The live view: polls the JSON API and updates the page in place (no reloads, no innerHTML
// with data: every string from a request goes in as text).
import { COLORS, barChart, lineChart, scatterChart } from "/ui/charts.js";

const $ = (id) => document.getElementById(id);
const MAX_ROWS = 200;
const POLL_MS = 1000;
const PHASES = ["network", "prefill_wait", "decode", "tail", "response"];

const state = { lastSeq: 0, filterKey: "", view: "", polling: false, summary: null, experimentsShown: null };

function ms(seconds, digits = 1) {
  return seconds == null ? "–" : (seconds * 1000).toFixed(digits);
}
function msUnit(seconds) {
  if (seconds == null) return "–";
  return seconds >= 10 ? `${seconds.toFixed(1)} s` : `${(seconds * 1000).toFixed(seconds < 0.01 ? 2 : 1)} ms`;
}
function clock(unix) {
  const d = new Date(unix * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null ? "–" : String(text);
  if (cls) td.className = cls;
  return td;
}
function setStatus(text, bad = false) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("bad", bad);
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new Error((body && body.error && body.error.message) || `HTTP ${response.status}`);
  return body;
}

// ---- the phase bar: one request's phases, to scale within its duration
function phaseParts(r) {
  const total = r.duration || 0;
  const network = r.network ?? total;
  if (r.ttft != null) {
    const decode = r.decode || 0;
    return [["network", network], ["prefill_wait", r.prefill_wait || 0], ["decode", decode], ["tail", Math.max(0, total - r.ttft - decode)]];
  }
  return [["network", network], ["response", Math.max(0, total - network)]];
}
function phaseBar(r) {
  const bar = document.createElement("div");
  bar.className = "phasebar";
  const total = r.duration || 0;
  for (const [name, value] of phaseParts(r)) {
    if (!(total > 0) || !(value > 0)) continue;
    const part = document.createElement("span");
    part.className = `seg ${name}`;
    part.style.width = `${(100 * value) / total}%`;
    part.title = `${name} ${msUnit(value)}`;
    bar.append(part);
  }
  return bar;
}

// ---- requests table
function filterParams() {
  const p = new URLSearchParams();
  if ($("f-api").value) p.set("api", $("f-api").value);
  if ($("f-model").value) p.set("model", $("f-model").value);
  if ($("f-errors").checked) p.set("errors", "1");
  if ($("f-slow").checked) p.set("slow", String(Math.max(0, Number($("f-slow-ms").value) || 0) / 1000));
  return p;
}
function requestRow(r) {
  const tr = document.createElement("tr");
  tr.dataset.id = r.id;
  tr.className = r.error_type ? "error" : "";
  const status = r.error_type ? `${r.status} ${r.error_type}` : String(r.status);
  tr.append(
    cell(clock(r.time)), cell(r.api), Object.assign(cell(r.model, "model"), { title: r.model ?? "" }), cell(status),
    cell(ms(r.ttft), "num"), cell(ms(r.tpot, 2), "num"), cell(r.output_tokens, "num"),
    cell(r.cached_input_tokens, "num"), cell(ms(r.duration), "num"),
  );
  const td = document.createElement("td");
  td.className = "bar-col";
  td.append(phaseBar(r));
  tr.append(td);
  tr.addEventListener("click", () => { location.hash = `#trace/${encodeURIComponent(r.id)}`; });
  return tr;
}
function syncOptions(select, values) {
  const have = new Set([...select.options].map((o) => o.value));
  for (const v of values) if (!have.has(v)) select.append(new Option(v, v));
}
async function pollRequests() {
  const params = filterParams();
  const key = params.toString();
  const tbody = document.querySelector("#requests tbody");
  if (key !== state.filterKey) {
    state.filterKey = key;
    state.lastSeq = 0;
    tbody.replaceChildren();
  }
  params.set("limit", String(MAX_ROWS));
  if (state.lastSeq) params.set("since", String(state.lastSeq));
  const body = await getJSON(`/api/requests?${params}`);
  if (state.filterKey !== key) return; // filters changed while we waited
  syncOptions($("f-api"), body.apis);
  syncOptions($("f-model"), body.models);
  const rows = body.requests.map(requestRow);
  if (rows.length) tbody.prepend(...rows);
  while (tbody.rows.length > MAX_ROWS) tbody.lastElementChild.remove();
  state.lastSeq = body.last_seq;
  $("empty").hidden = tbody.rows.length > 0;
  setStatus(`${body.size} of ${body.capacity} recent requests kept · updated ${clock(Date.now() / 1000)}`);
}

// ---- one request
function kvRows(table, pairs) {
  table.replaceChildren(...pairs.map(([k, v]) => {
    const tr = document.createElement("tr");
    tr.append(cell(k, "k"), cell(v));
    return tr;
  }));
}
function flatten(obj, prefix = "", out = []) {
  for (const [k, v] of Object.entries(obj)) {
    const name = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, name, out);
    else out.push([name, Array.isArray(v) ? v.join(", ") : v == null ? "–" : String(v)]);
  }
  return out;
}
// The network round trip inside prefill_wait: half going out with the request, half coming back
// with the first token; the rest is the provider's own wait (server_wait, an estimate).
function rttInside(bar, s) {
  const length = s.end - s.start || 1e-9;
  const half = Math.min(50, (50 * s.rtt) / length);
  for (const side of ["left", "right"]) {
    const part = document.createElement("span");
    part.className = "wf-rtt";
    part.style[side] = "0";
    part.style.width = `${half}%`;
    bar.append(part);
  }
  bar.title = `one network round trip ${msUnit(s.rtt)} (TCP min_rtt), server wait ≈ ${msUnit(s.server_wait ?? 0)} of ${msUnit(length)}`;
  bar.dataset.rtt = String(s.rtt);
}
function waterfall(d) {
  const box = $("waterfall");
  const total = d.spans[0].end || 1e-9;
  const rows = d.spans.map((s, i) => {
    const row = document.createElement("div");
    row.className = "wf-row";
    row.dataset.span = i === 0 ? "root" : s.name;
    const name = document.createElement("span");
    name.className = "wf-name" + (i ? " child" : "");
    name.textContent = s.name;
    const track = document.createElement("span");
    track.className = "wf-track";
    const bar = document.createElement("span");
    bar.className = `wf-bar ${i === 0 ? "root" : s.name}`;
    bar.style.left = `${(100 * s.start) / total}%`;
    bar.style.width = `${Math.max(0.2, (100 * (s.end - s.start)) / total)}%`;
    if (s.rtt != null) rttInside(bar, s);
    track.append(bar);
    const dur = document.createElement("span");
    dur.className = "wf-dur num";
    dur.textContent = msUnit(s.end - s.start);
    dur.dataset.seconds = String(s.end - s.start);
    row.append(name, track, dur);
    return row;
  });
  const marks = document.createElement("div");
  marks.className = "wf-row marks";
  const label = document.createElement("span");
  label.className = "wf-name";
  label.textContent = "marks";
  const track = document.createElement("span");
  track.className = "wf-track";
  const marksAt = [["headers", d.marks.time_to_headers], ["first byte", d.marks.ttfb], ["first token", d.marks.ttft]];
  marksAt.forEach(([name, t], i) => {
    if (t == null) return;
    const m = document.createElement("span");
    m.className = "wf-mark";
    m.style.left = `${(100 * t) / total}%`;
    m.style.top = `${i * 14}px`; // one line each: headers and first byte often coincide
    m.title = `${name} at ${msUnit(t)}`;
    m.textContent = `${name} ${msUnit(t)}`;
    track.append(m);
  });
  marks.append(label, track, document.createElement("span"));
  box.replaceChildren(...rows, marks);
}
function gapStrip(d) {
  const box = $("gaps");
  const values = d.gaps.values;
  if (!values.length) {
    box.replaceChildren();
    $("gaps-note").textContent = "no inter-token gaps (not streamed, or one token)";
    return;
  }
  const max = Math.max(...values);
  const sorted = [...values].sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)];
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${values.length} 50`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "gap-strip");
  values.forEach((v, i) => {
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const h = Math.max(0.5, (50 * v) / (max || 1));
    r.setAttribute("x", String(i));
    r.setAttribute("y", String(50 - h));
    r.setAttribute("width", "0.8");
    r.setAttribute("height", String(h));
    r.setAttribute("class", v > 5 * median && v > 0.05 ? "gap stall" : "gap");
    svg.append(r);
  });
  box.replaceChildren(svg);
  const each = d.gaps.per_bar > 1 ? `; each bar is the largest of ${d.gaps.per_bar} consecutive gaps` : "";
  $("gaps-note").textContent = `${d.gaps.count} gaps, median ${msUnit(median)}, largest ${msUnit(max)}${each}; red: over 5× the median`;
}
async function showTrace(id) {
  const d = await getJSON(`/api/requests/${encodeURIComponent(id)}`);
  const r = d.record;
  $("trace-title").textContent = `${d.spans[0].name} · ${r.status_code}${r.error_type ? " " + r.error_type : ""} · ${clock(d.time)} · ${r.trace_id || "not traced"}`;
  const link = $("trace-link");
  link.hidden = !d.trace_url;
  if (d.trace_url) link.href = d.trace_url;
  waterfall(d);
  const t = r.timing;
  const prefill = d.spans.find((s) => s.name === "prefill_wait");
  kvRows($("conn"), [
    ["connection reused", t.connection_reused == null ? "–" : t.connection_reused ? "yes" : "no (new connection)"],
    ["pool wait", msUnit(t.pool_wait)],
    ["DNS", msUnit(t.dns)],
    ["connect (TCP + TLS)", msUnit(t.connect)],
    ["network (request written)", msUnit(t.network)],
    ["time to headers", msUnit(t.time_to_headers)],
    ["TTFB (first body byte)", msUnit(t.ttfb)],
    ...("ttfc" in t ? [["TTFC (first streamed chunk)", msUnit(t.ttfc)]] : []),
    ["TTFT (first token)", msUnit(t.ttft)],
    ["first token − first byte", t.ttft != null && t.ttfb != null ? msUnit(t.ttft - t.ttfb) : "–"],
    ...(prefill && prefill.rtt != null
      ? [["round trip (TCP min_rtt)", msUnit(prefill.rtt)], ["server wait (estimate)", msUnit(prefill.server_wait)]]
      : []),
  ]);
  gapStrip(d);
  kvRows($("attrs"), flatten(r));
}

// ---- overview
function seriesFor(summary, kind) {
  const out = [];
  const legendItems = [];
  const withData = Object.entries(summary.series).filter(([, s]) => s[kind].p50.some((v) => v != null));
  withData.forEach(([model, s], i) => {
    const color = COLORS[i % COLORS.length];
    legendItems.push({ name: model, color });
    for (const [p, dash] of [["p50", ""], ["p95", "6 3"], ["p99", "2 3"]]) {
      out.push({ name: `${model} ${p}`, values: s[kind][p].map((v) => (v == null ? null : v * 1000)), color, dash });
    }
  });
  legendItems.push({ name: "p50 solid · p95 dashed · p99 dotted", color: "#999" });
  return { series: out, legendItems };
}
function renderOverview(s) {
  $("c-inflight").textContent = String(s.in_flight);
  $("c-rps").textContent = s.requests_per_s.length ? s.requests_per_s[s.requests_per_s.length - 1].toFixed(2) : "0";
  $("c-requests").textContent = String(s.requests);
  $("c-errors").textContent = String(Object.values(s.errors).reduce((a, b) => a + b, 0));
  const fmt = (v) => `${Number(v.toPrecision(3))} ms`;
  for (const kind of ["ttft", "tpot"]) {
    const { series, legendItems } = seriesFor(s, kind);
    lineChart($(`chart-${kind}`), { x: s.t, series, legendItems, yFormat: fmt, xFormat: clock });
  }
  lineChart($("chart-rate"), {
    x: s.t, series: [{ name: "requests/s", values: s.requests_per_s, color: COLORS[0] }],
    yFormat: (v) => String(Number(v.toPrecision(3))), xFormat: clock,
  });
  const share = $("phase-share");
  const total = PHASES.reduce((a, p) => a + s.phases[p], 0);
  const bar = document.createElement("div");
  bar.className = "phasebar big";
  const keys = document.createElement("p");
  keys.className = "legend";
  for (const p of PHASES) {
    const v = s.phases[p];
    if (!(v > 0) || !(total > 0)) continue;
    const seg = document.createElement("span");
    seg.className = `seg ${p}`;
    seg.style.width = `${(100 * v) / total}%`;
    seg.title = `${p}: ${((100 * v) / total).toFixed(1)} %`;
    bar.append(seg);
    const key = document.createElement("span");
    key.className = `key ${p}`;
    keys.append(key, document.createTextNode(`${p} ${((100 * v) / total).toFixed(1)} % `));
  }
  share.replaceChildren(bar, keys);
  const errors = Object.entries(s.errors);
  kvRows($("errors"), errors.length ? errors : [["none", "0"]]);
  const tbody = document.querySelector("#per-model tbody");
  tbody.replaceChildren(...Object.entries(s.models).map(([model, m]) => {
    const tr = document.createElement("tr");
    tr.append(cell(model, "model"), cell(m.requests, "num"));
    for (const kind of ["ttft", "tpot"]) for (const p of ["p50", "p95", "p99"]) tr.append(cell(ms(m[kind][p], kind === "tpot" ? 2 : 1), "num"));
    return tr;
  }));
}

// ---- demo
function renderDemo(ex) {
  $("demo-report").textContent = ex.report || "";
  const runs = ex.runs || [];
  const open = (r) => () => { if (r.trace_id) location.hash = `#trace/${r.trace_id}`; };
  const lengths = runs.filter((r) => r.experiment === "input_length" && r.input_tokens != null && r.ttft_s != null);
  const line = scatterChart($("chart-input"), {
    points: lengths.map((r) => ({ x: r.input_tokens, y: r.ttft_s * 1000, label: `${r.label}: ${r.input_tokens} tokens, TTFT ${ms(r.ttft_s)} ms`, onClick: open(r) })),
    fit: true, xFormat: (v) => String(v), yFormat: (v) => `${Number(v.toPrecision(3))} ms`,
  });
  $("fit-note").textContent = line
    ? `fitted: TTFT ≈ ${line.intercept.toFixed(1)} ms + ${(line.slope * 1000).toFixed(1)} ms per 1,000 input tokens (prefill grows with the input)`
    : "";
  const cache = runs.filter((r) => r.experiment === "prefix_cache");
  barChart($("chart-cache"), {
    groups: cache.map((r) => ({ label: `${r.label} (${r.cached_input_tokens ?? 0} cached)`, bars: [{ name: "TTFT", value: r.ttft_s == null ? null : r.ttft_s * 1000, color: COLORS[1], onClick: open(r) }] })),
    yFormat: (v) => `${Number(v.toPrecision(3))} ms`,
  });
  const sizes = runs.filter((r) => r.experiment === "model_size");
  barChart($("chart-models"), {
    groups: sizes.map((r) => ({ label: r.model, bars: [
      { name: "TTFT", value: r.ttft_s == null ? null : r.ttft_s * 1000, color: COLORS[0], onClick: open(r) },
      { name: "TPOT", value: r.tpot_s == null ? null : r.tpot_s * 1000, color: COLORS[2], onClick: open(r) },
    ] })),
    yFormat: (v) => `${Number(v.toPrecision(3))} ms`,
    legendItems: [{ name: "TTFT", color: COLORS[0] }, { name: "TPOT", color: COLORS[2] }],
  });
}

async function pollSummary() {
  const s = await getJSON("/api/summary");
  state.summary = s;
  $("demo-tab").hidden = !s.experiments;
  if (state.view === "overview") renderOverview(s);
  if (state.view === "demo" && s.experiments && state.experimentsShown !== s.experiments) {
    renderDemo(s.experiments);
    state.experimentsShown = s.experiments;
  }
}

// ---- views and the poll loop
let running = null; // one poll at a time: a filter change during a poll runs another after it
let again = false;
async function pollOnce() {
  try {
    if (state.view === "requests") await pollRequests();
    else if (state.view === "overview" || state.view === "demo") await pollSummary();
  } catch (err) {
    setStatus(`cannot reach the proxy: ${err.message}`, true);
  }
}
async function tick() {
  if (running) { again = true; return running; }
  running = (async () => {
    do { again = false; await pollOnce(); } while (again);
  })();
  try { await running; } finally { running = null; }
}
async function route() {
  const hash = location.hash.slice(1) || "requests";
  const [view, ...rest] = hash.split("/");
  state.view = ["requests", "overview", "demo", "trace"].includes(view) ? view : "requests";
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== `view-${state.view}`;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === state.view);
  state.experimentsShown = null;
  if (state.view === "trace") {
    try {
      await showTrace(decodeURIComponent(rest.join("/")));
    } catch (err) {
      setStatus(err.message, true);
    }
  }
  await tick();
}

async function loop() {
  await tick();
  setTimeout(loop, POLL_MS);
}

window.addEventListener("hashchange", route);
for (const id of ["f-api", "f-model", "f-errors", "f-slow", "f-slow-ms"]) $(id).addEventListener("change", tick);
$("filters").addEventListener("submit", (e) => e.preventDefault());
getJSON("/api/summary").then((s) => { $("demo-tab").hidden = !s.experiments; }).catch(() => {});
route().then(() => setTimeout(loop, POLL_MS));
