// The live view: polls the JSON API and updates the page in place (no reloads, no innerHTML
// with data: every string from a request goes in as text).
import { COLORS, barChart, lineChart, scatterChart } from "/ui/charts.js";

const $ = (id) => document.getElementById(id);
const PAGE_ROWS = 200; // rows the list shows at first, and how many more each "show more" adds
const POLL_MS = 1000;
const PHASES = ["network", "prefill_wait", "decode", "tail", "response"];
const EMPTY = "–"; // the one symbol for "no value"
// What a running request is doing, by the `phase` the API reports.
const RUNNING_PHASE = {
  network: "network", headers: "waiting for headers", prefill_wait: "prefill_wait", decode: "decode",
  thinking: "thinking", response: "receiving response",
};

const state = {
  lastSeq: 0, filterKey: "", view: "", polling: false, summary: null, experimentsShown: null,
  maxRows: PAGE_ROWS, traceId: null, pairId: null, pairDone: false,
};

function ms(seconds, digits = 1) {
  return seconds == null ? EMPTY : (seconds * 1000).toFixed(digits);
}
function msUnit(seconds) {
  if (seconds == null) return EMPTY;
  return seconds >= 10 ? `${seconds.toFixed(1)} s` : `${(seconds * 1000).toFixed(seconds < 0.01 ? 2 : 1)} ms`;
}
function clock(unix) {
  const d = new Date(unix * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null || text === "" ? EMPTY : String(text);
  if (cls) td.className = cls;
  return td;
}
// A request without a model name is "unknown" everywhere (the API names it so, as the metrics
// label it), and is set apart in the tables.
function modelName(model) {
  return model == null || model === "" ? "unknown" : model;
}
function modelCell(model) {
  const name = modelName(model);
  const td = cell(name, name === "unknown" ? "model none" : "model");
  td.title = name;
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
  if (!response.ok) {
    const err = new Error((body && body.error && body.error.message) || `HTTP ${response.status}`);
    err.status = response.status;
    throw err;
  }
  return body;
}

// ---- the phase bar: one request's phases, to scale within its duration (or a common scale)
function phaseParts(r) {
  const total = r.duration || 0;
  const network = r.network ?? total;
  if (r.ttft != null) {
    const decode = r.decode || 0;
    return [["network", network], ["prefill_wait", r.prefill_wait || 0], ["decode", decode], ["tail", Math.max(0, total - r.ttft - decode)]];
  }
  return [["network", network], ["response", Math.max(0, total - network)]];
}
// A running request's phases so far: the open one ends now.
function runningParts(r) {
  const now = r.elapsed || 0;
  if (r.network == null) return [["network", now]];
  if (!r.stream) return [["network", r.network], ["response", now - r.network]];
  if (r.ttft == null) return [["network", r.network], ["prefill_wait", now - r.network]];
  return [["network", r.network], ["prefill_wait", r.ttft - r.network], ["decode", now - r.ttft]];
}
function phaseBar(parts, total, running = false) {
  const bar = document.createElement("div");
  bar.className = running ? "phasebar running" : "phasebar";
  bar.dataset.seconds = String(total);
  for (const [name, value] of parts) {
    if (!(total > 0) || !(value > 0)) continue;
    const part = document.createElement("span");
    part.className = `seg ${name}`;
    part.style.width = `${(100 * value) / total}%`;
    part.title = `${name} ${msUnit(value)}`;
    bar.append(part);
  }
  return bar;
}
// With "bars on one time scale", every bar's length is its duration against the longest shown.
function rescaleBars() {
  const bars = [...document.querySelectorAll("#requests .phasebar")];
  const common = $("f-scale").checked;
  const longest = Math.max(0, ...bars.map((b) => Number(b.dataset.seconds) || 0));
  for (const bar of bars) {
    const seconds = Number(bar.dataset.seconds) || 0;
    bar.style.width = common && longest > 0 ? `${Math.max(0.5, (100 * seconds) / longest)}%` : "";
  }
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
function openOnKeys(tr, go) {
  tr.tabIndex = 0; // rows are reachable with Tab and open with Enter or Space
  tr.setAttribute("role", "link");
  tr.addEventListener("click", go);
  tr.addEventListener("keydown", (e) => {
    if (e.target !== tr) return; // a link inside the row (its pair) opens itself
    if (e.key === "Enter" || e.key === " ") { e.preventDefault(); go(); }
  });
}
// The route a request went to; with --mirror, a mark on the copy and a link to the pair.
function upstreamCell(r) {
  const td = cell(r.upstream, "upstream");
  if (r.mirror) {
    const mark = document.createElement("span");
    mark.className = "badge mirror";
    mark.textContent = "mirror copy";
    mark.title = "a copy --mirror sent to a second upstream: not client traffic";
    td.prepend(mark, " ");
  }
  if (r.pair_id) {
    const a = document.createElement("a");
    a.className = "pair-link";
    a.href = `#pair/${encodeURIComponent(r.pair_id)}`;
    a.textContent = "⇄ pair";
    a.title = r.mirror ? "this copy beside the request it copied" : "this request beside its mirror copy";
    a.addEventListener("click", (e) => e.stopPropagation()); // the row would open the waterfall
    td.append(" ", a);
  }
  return td;
}
function requestRow(r) {
  const tr = document.createElement("tr");
  tr.dataset.id = r.id;
  tr.className = (r.error_type ? "error" : "") + (r.mirror ? " mirror" : "");
  const status = r.error_type ? `${r.status} ${r.error_type}` : String(r.status);
  const ttft = cell(ms(r.ttft), "num");
  // A reasoning model's: TTFT is its first thought; the answer came later (or hid in prefill_wait).
  if (r.thinking != null) ttft.title = `first answer token ${msUnit(r.time_to_first_answer_token)}, after ${msUnit(r.thinking)} of thinking`;
  else if (r.thinking_estimated != null) ttft.title = `of which ≈ ${msUnit(r.thinking_estimated)} hidden thinking (estimated)`;
  tr.append(
    cell(clock(r.time)), cell(r.api), modelCell(r.model), upstreamCell(r), cell(status, "status"),
    ttft, cell(ms(r.tpot, 2), "num"), cell(r.output_tokens, "num"),
    cell(r.cached_input_tokens, "num"), cell(ms(r.duration), "num"),
  );
  const td = document.createElement("td");
  td.className = "bar-col";
  td.append(phaseBar(phaseParts(r), r.duration || 0));
  tr.append(td);
  const copy = r.mirror ? ` (mirror copy to ${r.upstream})` : "";
  tr.setAttribute("aria-label", `${r.api} ${modelName(r.model)}${copy} ${status}, ${msUnit(r.duration)}: open its waterfall`);
  openOnKeys(tr, () => { location.hash = `#trace/${encodeURIComponent(r.id)}`; });
  return tr;
}
function runningRow(r) {
  const tr = document.createElement("tr");
  tr.dataset.id = r.id;
  tr.dataset.phase = r.phase;
  tr.className = "running";
  const phase = RUNNING_PHASE[r.phase] || r.phase;
  const status = r.phase === "decode" ? `running · decode, ${r.output_tokens} tokens` : `running · ${phase}`;
  const tpot = r.output_tokens >= 2 && r.last_token != null && r.ttft != null ? (r.last_token - r.ttft) / (r.output_tokens - 1) : null;
  tr.append(
    cell(clock(r.started)), cell(r.api), modelCell(r.model), cell(r.upstream, "upstream"), cell(status, "phase"),
    cell(ms(r.ttft), "num"), cell(ms(tpot, 2), "num"), cell(r.output_tokens, "num"),
    cell(null, "num"), cell(ms(r.elapsed), "num elapsed"),
  );
  const td = document.createElement("td");
  td.className = "bar-col";
  td.append(phaseBar(runningParts(r), r.elapsed || 0, true));
  tr.append(td);
  tr.setAttribute("aria-label", `${r.api} ${modelName(r.model)} still running, ${phase}, ${msUnit(r.elapsed)} so far: open its waterfall`);
  openOnKeys(tr, () => { location.hash = `#trace/${encodeURIComponent(r.id)}`; });
  return tr;
}
function syncOptions(select, values) {
  const have = new Set([...select.options].map((o) => o.value));
  for (const v of values) if (!have.has(v)) select.append(new Option(v, v));
}
async function pollRequests() {
  const params = filterParams();
  const key = `${params}&rows=${state.maxRows}`;
  const tbody = $("finished");
  if (key !== state.filterKey) {
    state.filterKey = key;
    state.lastSeq = 0;
    tbody.replaceChildren();
  }
  params.set("limit", String(state.maxRows));
  if (state.lastSeq) params.set("since", String(state.lastSeq));
  const body = await getJSON(`/api/requests?${params}`);
  if (state.filterKey !== key) return; // filters changed while we waited
  syncOptions($("f-api"), body.apis);
  syncOptions($("f-model"), body.models);
  $("running").replaceChildren(...body.in_flight.map(runningRow));
  const rows = body.requests.map(requestRow);
  if (rows.length) tbody.prepend(...rows);
  while (tbody.rows.length > state.maxRows) tbody.lastElementChild.remove();
  state.lastSeq = body.last_seq;
  rescaleBars();
  $("empty").hidden = tbody.rows.length + body.in_flight.length > 0;
  // The list shows the newest maxRows; say so when the proxy keeps more, and offer the next page.
  const capped = tbody.rows.length >= state.maxRows && body.size > state.maxRows;
  $("more").hidden = !capped;
  if (capped) {
    $("more-text").textContent = `Showing the newest ${tbody.rows.length} of the ${body.size} requests kept.`;
    $("more-button").hidden = state.maxRows >= body.capacity;
  }
  const running = body.in_flight.length ? ` · ${body.in_flight.length} running` : "";
  setStatus(`${body.size} of ${body.capacity} recent requests kept${running} · updated ${clock(Date.now() / 1000)}`);
}

// ---- one request
function kvRows(table, pairs) {
  table.replaceChildren(...pairs.map(([k, v]) => {
    const tr = document.createElement("tr");
    tr.append(cell(k, "k"), cell(v));
    return tr;
  }));
}
// Attributes that hold seconds: shown in ms like the rest of the page.
const SECONDS = /^(timing\.|tcp\.(rtt|rtt_var|min_rtt)$|(elapsed|network|time_to_headers|ttfb|ttft|last_token|last_byte)$)/;
function shown(name, v) {
  if (v == null || v === "" || (Array.isArray(v) && !v.length)) return EMPTY;
  if (name === "started" && typeof v === "number") return clock(v);
  if (name === "tcp.delivery_rate" && typeof v === "number") return `${(v / 1e6).toFixed(1)} MB/s`;
  if (typeof v === "number" && SECONDS.test(name) && !/token_events$/.test(name)) return msUnit(v);
  if (Array.isArray(v)) return v.join(", ");
  return String(v);
}
function flatten(obj, prefix = "", out = []) {
  for (const [k, v] of Object.entries(obj)) {
    const name = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) {
      if (Object.keys(v).length) flatten(v, name, out);
      else out.push([name, EMPTY]);
    } else out.push([name, shown(name, v)]);
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
// `depth`: 0 the root, 1 a phase, 2 a span inside a phase (a reasoning model's thinking).
function wfRow(key, label, start, end, total, cls, depth) {
  const row = document.createElement("div");
  row.className = "wf-row";
  row.dataset.span = key;
  const name = document.createElement("span");
  name.className = "wf-name" + (depth ? " child" : "") + (depth === 2 ? " inner" : "");
  name.textContent = label;
  name.title = label;
  const track = document.createElement("span");
  track.className = "wf-track";
  const bar = document.createElement("span");
  bar.className = `wf-bar ${cls}`;
  bar.style.left = `${(100 * start) / total}%`;
  bar.style.width = `${Math.max(0.2, (100 * (end - start)) / total)}%`;
  track.append(bar);
  const dur = document.createElement("span");
  dur.className = "wf-dur num";
  dur.textContent = msUnit(end - start);
  dur.dataset.seconds = String(end - start);
  row.append(name, track, dur);
  return { row, bar };
}
// One request's waterfall in `box`; `scale` (seconds) draws it against a longer time, so two
// waterfalls side by side share one time scale.
function waterfall(d, box = $("waterfall"), scale = 0) {
  const r = d.record;
  const end = d.spans[0].end; // this request's own end
  const total = Math.max(scale, end) || 1e-9;
  const running = !!d.in_flight;
  const rows = d.spans.map((s, i) => {
    const estimated = s.estimated === true;
    const label = estimated ? `${s.name} (estimated)` : s.name;
    const cls = i === 0 ? "root" : s.name + (estimated ? " estimated" : "");
    const { row, bar } = wfRow(i === 0 ? "root" : s.name, label, s.start, s.end, total, cls, i === 0 ? 0 : s.parent ? 2 : 1);
    if (running && s.end === end) bar.classList.add("open"); // still growing
    if (s.rtt != null) rttInside(bar, s);
    if (estimated) {
      // Hidden reasoning: never measured, an estimate from the reported reasoning tokens.
      row.dataset.estimated = "true";
      row.querySelector(".wf-name").classList.add("estimated");
      bar.title = `estimated, not measured: ${r.usage.reasoning_tokens} hidden reasoning tokens at the answer's own pace (${msUnit(r.timing.answer_tpot)} per token), inside prefill_wait`;
    } else if (s.name === "thinking") {
      bar.title = `thinking (streamed reasoning), measured: ${msUnit(s.end - s.start)}`;
    }
    return row;
  });
  // A response that is not a stream has no prefill_wait or decode: draw the wait for it anyway.
  const network = d.spans.find((s) => s.name === "network");
  const streamed = d.spans.some((s) => s.name === "prefill_wait");
  if (!streamed && network && network.end < end) {
    const { row, bar } = wfRow("response", "waiting for the response (not streamed)", network.end, end, total, "response", 1);
    if (running) bar.classList.add("open");
    rows.push(row);
  }
  const marks = document.createElement("div");
  marks.className = "wf-row marks";
  const label = document.createElement("span");
  label.className = "wf-name";
  label.textContent = "marks";
  const track = document.createElement("span");
  track.className = "wf-track";
  // A reasoning model's answer begins after its thinking: its own mark, on a line of its own.
  const answer = d.marks.first_answer != null && d.marks.first_answer !== d.marks.ttft ? d.marks.first_answer : null;
  const marksAt = [["headers", d.marks.time_to_headers], ["first byte", d.marks.ttfb], ["first token", d.marks.ttft], ["first answer token", answer]];
  marksAt.forEach(([name, t], i) => {
    if (t == null) return;
    const m = document.createElement("span");
    m.className = "wf-mark";
    m.style.left = `${(100 * t) / total}%`;
    m.style.top = `${i * 14}px`; // one line each: headers and first byte often coincide
    m.title = `${name} at ${msUnit(t)}`;
    m.textContent = `${name} ${msUnit(t)}`;
    if (t / total > 0.7) m.classList.add("left"); // near the right edge: the label reads leftwards
    track.append(m);
  });
  // A stream that was cut or failed: where it broke (the last bytes the client got), and why.
  if (!running && r.error_type && (r.stream || d.marks.last_byte != null)) {
    const at = d.marks.last_byte ?? end;
    const m = document.createElement("span");
    m.className = "wf-mark broke";
    m.style.left = `${(100 * at) / total}%`;
    m.style.top = "56px";
    m.textContent = `✕ ${r.error_type} · last byte ${msUnit(at)}`;
    m.title = `the stream broke: ${r.error_type}; the client's last bytes at ${msUnit(at)}, the request ended at ${msUnit(end)}`;
    if (at / total > 0.5) m.classList.add("left");
    track.append(m);
    marks.classList.add("broke");
  }
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
  let d;
  try {
    d = await getJSON(`/api/requests/${encodeURIComponent(id)}`);
  } catch (err) {
    // A running request whose trace the sampler dropped ends under another id: back to the list.
    if (err.status === 404 && state.traceRunning === id) { location.hash = "#requests"; return; }
    throw err;
  }
  if (state.view !== "trace" || state.traceId !== id) return; // the reader moved on meanwhile
  const r = d.record;
  const running = !!d.in_flight;
  state.traceRunning = running ? id : null;
  $("trace-running").hidden = !running;
  const status = running ? `running · ${RUNNING_PHASE[r.phase] || r.phase}` : `${r.status_code}${r.error_type ? " " + r.error_type : ""}`;
  $("trace-title").textContent = `${d.spans[0].name} · ${status} · ${clock(d.time)} · ${r.trace_id || "not traced"}`;
  const link = $("trace-link");
  link.hidden = !d.trace_url;
  if (d.trace_url) link.href = d.trace_url;
  waterfall(d);
  const pair = $("trace-pair");
  pair.hidden = !r.pair_id;
  if (r.pair_id) {
    pair.href = `#pair/${encodeURIComponent(r.pair_id)}`;
    pair.textContent = r.mirror ? "⇄ beside the request it copied" : "⇄ beside its mirror copy";
  }
  const t = running ? r : r.timing;
  const prefill = d.spans.find((s) => s.name === "prefill_wait");
  kvRows($("conn"), [
    ["connection reused", t.connection_reused == null ? EMPTY : t.connection_reused ? "yes" : "no (new connection)"],
    ["pool wait", msUnit(t.pool_wait)],
    ["DNS", msUnit(t.dns)],
    ["connect (TCP + TLS)", msUnit(t.connect)],
    ["network (request written)", msUnit(t.network)],
    ["time to headers", msUnit(t.time_to_headers)],
    ["TTFB (first body byte)", msUnit(t.ttfb)],
    ...("ttfc" in t ? [["TTFC (first streamed chunk)", msUnit(t.ttfc)]] : []),
    ["TTFT (first token)", msUnit(t.ttft)],
    ["first token − first byte", t.ttft != null && t.ttfb != null ? msUnit(t.ttft - t.ttfb) : EMPTY],
    ...reasoningRows(running ? null : t, running ? r : null),
    ...(prefill && prefill.rtt != null
      ? [["round trip (TCP min_rtt)", msUnit(prefill.rtt)], ["server wait (estimate)", msUnit(prefill.server_wait)]]
      : []),
  ]);
  gapStrip(d);
  kvRows($("attrs"), flatten(r));
}

// A reasoning model's numbers, beside the TTFT: the answer's first token, the thinking before it
// (measured from streamed reasoning), or hidden reasoning's share of prefill_wait (an estimate).
function reasoningRows(t, running) {
  const rate = (tpot) => (tpot ? `${(1 / tpot).toFixed(1)} tok/s` : EMPTY);
  if (running) {
    return running.first_answer != null && running.first_answer !== running.ttft
      ? [["first answer token", msUnit(running.first_answer)], ["thinking", msUnit(running.first_answer - running.ttft)]]
      : [];
  }
  const rows = [];
  if (t.time_to_first_answer_token != null && t.time_to_first_answer_token !== t.ttft) rows.push(["first answer token", msUnit(t.time_to_first_answer_token)]);
  if (t.thinking != null) rows.push(["thinking (streamed reasoning, measured)", msUnit(t.thinking)]);
  if (t.thinking_total != null && t.thinking_total !== t.thinking) rows.push(["thinking, every run (interleaved)", msUnit(t.thinking_total)]);
  if (t.thinking_estimated != null) rows.push(["hidden thinking (estimated, not measured)", msUnit(t.thinking_estimated)]);
  if (t.reasoning_token_events && t.thinking_total) rows.push(["reasoning pace", rate(t.thinking_total / t.reasoning_token_events)]);
  if (t.answer_tpot != null) rows.push(["answer pace", rate(t.answer_tpot)]);
  return rows;
}

// ---- a pair (--mirror): the request and its mirror copy side by side
// A difference mirror − request, signed, in ms (or tokens); "+" means the mirror took longer.
function signedMs(seconds) {
  if (seconds == null) return EMPTY;
  const sign = seconds > 0 ? "+" : seconds < 0 ? "−" : "±";
  return `${sign}${msUnit(Math.abs(seconds))}`;
}
function signedCount(n) {
  if (n == null) return EMPTY;
  return `${n > 0 ? "+" : n < 0 ? "−" : "±"}${Math.abs(n)}`;
}
function outcomeText(r) {
  return r.error_type ? `${r.status_code} ${r.error_type}` : `${r.status_code} ok`;
}
function pairRows(req, mir, diff) {
  const a = req ? req.record : null;
  const b = mir ? mir.record : null;
  const timing = (x, k) => (x ? x.timing[k] : null);
  const rtt = (d) => { const s = d && d.spans.find((p) => p.name === "prefill_wait"); return s ? s.rtt : null; };
  const wait = (d) => { const s = d && d.spans.find((p) => p.name === "prefill_wait"); return s ? s.server_wait : null; };
  const minus = (x, y) => (x == null || y == null ? null : x - y);
  const rows = [
    // [label, request, mirror, difference, key: which of the two is worse when the difference is > 0]
    ["outcome", a && outcomeText(a), b && outcomeText(b),
      diff ? (diff.outcome.request === diff.outcome.mirror ? "same" : "differs") : EMPTY, "outcome"],
    ["TTFT", msUnit(timing(a, "ttft")), msUnit(timing(b, "ttft")), signedMs(diff && diff.ttft), "ttft", diff && diff.ttft],
    ["TPOT", msUnit(timing(a, "tpot")), msUnit(timing(b, "tpot")), signedMs(diff && diff.tpot), "tpot", diff && diff.tpot],
    ["output tokens", a && a.usage.output_tokens, b && b.usage.output_tokens, signedCount(diff && diff.output_tokens), "output_tokens"],
    ["input tokens", a && a.usage.input_tokens, b && b.usage.input_tokens,
      signedCount(a && b ? minus(b.usage.input_tokens, a.usage.input_tokens) : null), "input_tokens"],
    ["duration", msUnit(timing(a, "duration")), msUnit(timing(b, "duration")), signedMs(diff && diff.duration), "duration", diff && diff.duration],
    ["network", msUnit(timing(a, "network")), msUnit(timing(b, "network")),
      signedMs(minus(timing(b, "network"), timing(a, "network"))), "network"],
    ["prefill_wait", msUnit(timing(a, "prefill_wait")), msUnit(timing(b, "prefill_wait")),
      signedMs(minus(timing(b, "prefill_wait"), timing(a, "prefill_wait"))), "prefill_wait"],
    ["decode", msUnit(timing(a, "decode")), msUnit(timing(b, "decode")),
      signedMs(minus(timing(b, "decode"), timing(a, "decode"))), "decode"],
    ["round trip (TCP min_rtt)", msUnit(rtt(req)), msUnit(rtt(mir)), signedMs(diff && diff.rtt), "rtt"],
    ["server wait (estimate)", msUnit(wait(req)), msUnit(wait(mir)), signedMs(minus(wait(mir), wait(req))), "server_wait"],
  ];
  return rows.map(([label, x, y, d, key, seconds]) => {
    const tr = document.createElement("tr");
    tr.dataset.key = key;
    const delta = cell(d, "num diff");
    if (seconds != null && seconds !== 0) delta.classList.add(seconds > 0 ? "mirror-slower" : "mirror-faster");
    if (seconds != null) delta.dataset.seconds = String(seconds);
    tr.append(cell(label, "k"), cell(x, "num"), cell(y, "num"), delta);
    return tr;
  });
}
async function showPair(id) {
  const p = await getJSON(`/api/pairs/${encodeURIComponent(id)}`);
  if (state.view !== "pair" || state.pairId !== id) return; // the reader moved on meanwhile
  const req = p.request, mir = p.mirror;
  state.pairDone = !!(req && mir);
  const any = (req || mir).record;
  $("pair-title").textContent = `pair ${p.pair_id} · ${any.api} · ${modelName(any.model)}`;
  const missing = !req ? "The request itself is no longer among the recent ones kept."
    : !mir ? "The mirror copy has not finished yet (it shows here when it ends), or is no longer kept." : "";
  $("pair-note").hidden = !missing;
  $("pair-note").textContent = missing;
  for (const [side, d, label] of [["request", req, "request"], ["mirror", mir, "mirror copy"]]) {
    const where = d ? ` · ${d.record.upstream}` : "";
    $(`pair-h-${side}`).textContent = `${label}${where}`;
    $(`pair-wf-${side}-title`).textContent = `${label}${where}`;
    const open = $(`pair-open-${side}`);
    open.hidden = !d;
    if (d) open.href = `#trace/${encodeURIComponent(d.id)}`;
  }
  $("pair-table").querySelector("tbody").replaceChildren(...pairRows(req, mir, p.differences));
  // One time scale for both: the longer of the two fills its track.
  const scale = Math.max(req ? req.spans[0].end : 0, mir ? mir.spans[0].end : 0);
  for (const [side, d] of [["request", req], ["mirror", mir]]) {
    const box = $(`pair-wf-${side}`);
    if (d) waterfall(d, box, scale);
    else box.replaceChildren(Object.assign(document.createElement("p"), { className: "hint", textContent: EMPTY }));
    box.dataset.seconds = d ? String(d.spans[0].end) : "";
  }
  $("pair-scale").textContent = `Both waterfalls on one time scale, each from its own start: the full width is ${msUnit(scale)}.`;
}

// ---- overview
function renderPairs(pairs) {
  $("pairs-box").hidden = !pairs.length;
  const signed = (v, digits) => (v == null ? EMPTY : `${v > 0 ? "+" : v < 0 ? "−" : "±"}${ms(Math.abs(v), digits)}`);
  document.querySelector("#pairs tbody").replaceChildren(...pairs.map((g) => {
    const tr = document.createElement("tr");
    tr.append(
      cell(g.upstream), cell(g.mirror), cell(g.pairs, "num"), cell(g.both_ok, "num"),
      cell(`${g.request_errors} / ${g.mirror_errors}`, "num"),
      cell(signed(g.ttft_difference_p50, 1), "num"), cell(signed(g.tpot_difference_p50, 2), "num"),
      cell(g.compared ? `${g.mirror_first} of ${g.compared}` : EMPTY, "num"),
    );
    return tr;
  }));
}
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
  renderPairs(s.pairs || []);
  const tbody = document.querySelector("#per-model tbody");
  tbody.replaceChildren(...Object.entries(s.models).map(([model, m]) => {
    const tr = document.createElement("tr");
    tr.append(modelCell(model), cell(m.requests, "num"));
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
  $("demo-empty").hidden = !!s.experiments;
  $("demo-body").hidden = !s.experiments;
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
    else if (state.view === "trace" && state.traceRunning && state.traceRunning === state.traceId) await showTrace(state.traceId);
    else if (state.view === "pair" && !state.pairDone) await showPair(state.pairId); // until both halves are in
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
  state.view = ["requests", "overview", "demo", "trace", "pair"].includes(view) ? view : "requests";
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== `view-${state.view}`;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === state.view);
  state.experimentsShown = null;
  state.traceId = state.view === "trace" ? decodeURIComponent(rest.join("/")) : null;
  state.traceRunning = null;
  state.pairId = state.view === "pair" ? decodeURIComponent(rest.join("/")) : null;
  state.pairDone = false;
  if (state.view === "pair") {
    try {
      await showPair(state.pairId);
    } catch (err) {
      setStatus(err.message, true);
    }
  }
  if (state.view === "trace") {
    try {
      await showTrace(state.traceId);
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
for (const id of ["f-api", "f-model", "f-errors", "f-slow", "f-slow-ms"]) {
  $(id).addEventListener("change", () => { state.maxRows = PAGE_ROWS; tick(); });
}
$("f-scale").addEventListener("change", rescaleBars);
$("more-button").addEventListener("click", () => { state.maxRows += PAGE_ROWS; tick(); });
$("filters").addEventListener("submit", (e) => e.preventDefault());
getJSON("/api/summary").then((s) => {
  $("demo-tab").hidden = !s.experiments;
  $("demo-empty").hidden = !!s.experiments;
  $("demo-body").hidden = !s.experiments;
}).catch(() => {});
route().then(() => setTimeout(loop, POLL_MS));
