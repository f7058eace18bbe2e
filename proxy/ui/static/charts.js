// Small SVG charts: lines over time, a scatter with its least-squares line, grouped bars.
// Every label goes in through textContent, so data can never become markup.
const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 240, PAD = { l: 56, r: 12, t: 12, b: 30 };
export const COLORS = ["#2f6fd0", "#d0522f", "#2f9d5a", "#8a4fc4", "#c49a1a", "#1a9cb0", "#c43f7a", "#6b6b6b"];

function el(name, attrs = {}, text) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function niceTicks(max, count = 4) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const ticks = [];
  for (let v = 0; v <= max + step * 0.999; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function frame(container, yMax, yFormat, xTicks) {
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img" });
  const ticks = niceTicks(yMax);
  const top = ticks[ticks.length - 1] || 1;
  const y = (v) => PAD.t + (H - PAD.t - PAD.b) * (1 - v / top);
  for (const t of ticks) {
    svg.append(el("line", { x1: PAD.l, x2: W - PAD.r, y1: y(t), y2: y(t), class: "grid" }));
    svg.append(el("text", { x: PAD.l - 6, y: y(t) + 4, class: "tick", "text-anchor": "end" }, yFormat(t)));
  }
  for (const [x, label] of xTicks) {
    // A label centred on a tick near either edge would be cut by the viewBox: anchor it inwards.
    const anchor = x > W - PAD.r - 32 ? "end" : x < 32 ? "start" : "middle";
    svg.append(el("text", { x, y: H - 10, class: "tick", "text-anchor": anchor }, label));
  }
  container.replaceChildren(svg);
  return { svg, y };
}

function legend(container, items) {
  const box = document.createElement("div");
  box.className = "chart-legend";
  for (const { name, color, dash } of items) {
    const item = document.createElement("span");
    const key = document.createElement("span");
    key.className = "swatch" + (dash ? " dashed" : "");
    key.style.borderColor = color;
    item.append(key, document.createTextNode(name));
    box.append(item);
  }
  container.append(box);
}

// series: [{name, values: [number|null], color, dash}], x: [seconds since epoch]
export function lineChart(container, { x, series, yFormat, xFormat, legendItems }) {
  const all = series.flatMap((s) => s.values).filter((v) => v != null);
  if (!x.length || !all.length) {
    container.replaceChildren(Object.assign(document.createElement("p"), { className: "hint", textContent: "no data yet" }));
    return;
  }
  const x0 = x[0], x1 = Math.max(x[x.length - 1], x0 + 1);
  const px = (t) => PAD.l + (W - PAD.l - PAD.r) * ((t - x0) / (x1 - x0));
  const every = Math.max(1, Math.ceil(x.length / 6));
  const xTicks = x.filter((_, i) => i % every === 0).map((t) => [px(t), xFormat(t)]);
  const { svg, y } = frame(container, Math.max(...all), yFormat, xTicks);
  for (const s of series) {
    let d = "";
    let pen = false;
    s.values.forEach((v, i) => {
      if (v == null) { pen = false; return; }
      d += `${pen ? "L" : "M"}${px(x[i]).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    const path = el("path", { d, class: "line", stroke: s.color });
    if (s.dash) path.setAttribute("stroke-dasharray", s.dash);
    path.append(el("title", {}, s.name));
    svg.append(path);
    s.values.forEach((v, i) => {
      if (v != null) svg.append(el("circle", { cx: px(x[i]), cy: y(v), r: 2.5, fill: s.color, class: "point" }));
    });
  }
  legend(container, legendItems || series);
}

// points: [{x, y, label, onClick}]; draws the least-squares line when fit is true
export function scatterChart(container, { points, fit, xFormat, yFormat, color = COLORS[0] }) {
  if (!points.length) {
    container.replaceChildren(Object.assign(document.createElement("p"), { className: "hint", textContent: "no data" }));
    return null;
  }
  const xMax = Math.max(...points.map((p) => p.x)) * 1.1 || 1;
  const px = (v) => PAD.l + (W - PAD.l - PAD.r) * (v / xMax);
  const xTicks = niceTicks(xMax, 5).filter((t) => t <= xMax).map((t) => [px(t), xFormat(t)]);
  const line = fit && points.length >= 2 ? leastSquares(points) : null;
  const yMax = Math.max(...points.map((p) => p.y), line ? line.intercept + line.slope * xMax : 0);
  const { svg, y } = frame(container, yMax, yFormat, xTicks);
  if (line) {
    const at = (v) => Math.max(0, line.intercept + line.slope * v);
    svg.append(el("line", { x1: px(0), y1: y(at(0)), x2: px(xMax), y2: y(at(xMax)), class: "fit" }));
  }
  for (const p of points) {
    const dot = el("circle", { cx: px(p.x), cy: y(p.y), r: 5, fill: color, class: "point clickable" });
    dot.append(el("title", {}, p.label));
    if (p.onClick) dot.addEventListener("click", p.onClick);
    svg.append(dot);
  }
  return line;
}

export function leastSquares(points) {
  const n = points.length;
  const mx = points.reduce((a, p) => a + p.x, 0) / n;
  const my = points.reduce((a, p) => a + p.y, 0) / n;
  let sxy = 0, sxx = 0;
  for (const p of points) { sxy += (p.x - mx) * (p.y - my); sxx += (p.x - mx) ** 2; }
  const slope = sxx ? sxy / sxx : 0;
  return { slope, intercept: my - slope * mx };
}

// groups: [{label, bars: [{name, value, color, onClick}]}]; values on one axis
export function barChart(container, { groups, yFormat, legendItems }) {
  const values = groups.flatMap((g) => g.bars.map((b) => b.value)).filter((v) => v != null);
  if (!values.length) {
    container.replaceChildren(Object.assign(document.createElement("p"), { className: "hint", textContent: "no data" }));
    return;
  }
  const slot = (W - PAD.l - PAD.r) / groups.length;
  const xTicks = groups.map((g, i) => [PAD.l + slot * (i + 0.5), g.label]);
  const { svg, y } = frame(container, Math.max(...values), yFormat, xTicks);
  groups.forEach((g, i) => {
    const width = (slot * 0.7) / g.bars.length;
    g.bars.forEach((b, j) => {
      if (b.value == null) return;
      const x = PAD.l + slot * i + slot * 0.15 + width * j;
      const rect = el("rect", { x, y: y(b.value), width: width - 2, height: y(0) - y(b.value), fill: b.color, class: "bar clickable" });
      rect.append(el("title", {}, `${g.label} ${b.name}: ${yFormat(b.value)}`));
      if (b.onClick) rect.addEventListener("click", b.onClick);
      svg.append(rect);
      svg.append(el("text", { x: x + (width - 2) / 2, y: y(b.value) - 4, class: "tick", "text-anchor": "middle" }, yFormat(b.value)));
    });
  });
  if (legendItems) legend(container, legendItems);
}
