// Line and stacked-area charts in plain SVG: hover shows the values at the nearest x, a drag
// zooms into an x range, a double click zooms out. No library.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

function svgEl(name, attrs, parent) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

// The y range drawn for values ys: their extent, padded, and never narrower than 1% of their
// magnitude, so that an entropy moving by 1e-5 around 5 draws flat instead of as a trend.
function yRange(ys, stacked) {
  let lo = stacked ? 0 : Math.min(...ys), hi = Math.max(...ys);
  const least = Math.max(Math.abs(lo), Math.abs(hi)) * 0.01;
  if (hi - lo < least) { const mid = (lo + hi) / 2; lo = stacked ? 0 : mid - least / 2; hi = mid + least / 2; }
  if (lo === hi) { lo -= 0.5; hi += 0.5; }
  const pad = (hi - lo) * 0.06;
  return [lo - (stacked ? 0 : pad), hi + pad];
}

function niceTicks(lo, hi, count) {
  if (!isFinite(lo) || !isFinite(hi)) return [];
  if (lo === hi) return [lo];
  const step0 = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) || step0;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toPrecision(12));
  return ticks;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : v.toPrecision(4).replace(/\.?0+$/, "");
}

// series: [{name, points: [[x, y], ...], dashed}]; options: {title, metric, stacked, xLabel}
function drawChart(figure, series, options) {
  figure.innerHTML = "";
  figure.classList.add("chart");
  if (options.metric) figure.dataset.metric = options.metric;
  const caption = document.createElement("figcaption");
  caption.textContent = options.title;
  figure.appendChild(caption);
  const W = 420, H = 220, L = 52, R = 10, T = 10, B = 28;
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, class: "plot"}, figure);
  const all = series.flatMap((s) => s.points);
  if (!all.length) {
    const empty = document.createElement("p");
    empty.className = "muted";
    empty.textContent = "no points yet";
    figure.replaceChild(empty, svg);
    return;
  }
  let stackedTop = null;
  if (options.stacked) {  // each series on top of the ones before it, by x; a missing value is 0
    const every = [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b);
    series = series.map((s) => {
      const at = new Map(s.points);
      return {...s, points: every.map((x) => [x, at.get(x) || 0])};
    });
    const base = new Map();
    stackedTop = series.map((s) => s.points.map(([x, y]) => {
      const b = base.get(x) || 0;
      base.set(x, b + y);
      return [x, b, b + y];
    }));
  }
  const xs = all.map((p) => p[0]);
  const full = [Math.min(...xs), Math.max(...xs)];
  const domain = figure._zoom || full;
  let ys = [];
  series.forEach((s, i) => s.points.forEach((p, j) => {
    if (p[0] >= domain[0] && p[0] <= domain[1]) ys.push(stackedTop ? stackedTop[i][j][2] : p[1]);
  }));
  if (!ys.length) ys = [0];
  let [lo, hi] = yRange(ys, options.stacked);
  const span = domain[1] - domain[0] || 1;
  const sx = (x) => L + ((x - domain[0]) / span) * (W - L - R) + (domain[0] === domain[1] ? (W - L - R) / 2 : 0);
  const sy = (y) => T + (1 - (y - lo) / (hi - lo)) * (H - T - B);
  const axes = svgEl("g", {class: "axes"}, svg);
  const yTicks = niceTicks(lo, hi, 4);
  const step = yTicks.length > 1 ? yTicks[1] - yTicks[0] : 1;
  const decimals = Math.max(0, Math.min(10, -Math.floor(Math.log10(step))));  // ticks that differ
  for (const t of yTicks) {
    svgEl("line", {x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid"}, axes);
    const label = Math.abs(t) >= 1e5 ? t.toExponential(2) : t.toFixed(decimals);
    svgEl("text", {x: L - 4, y: sy(t) + 3, "text-anchor": "end"}, axes).textContent = label;
  }
  for (const t of niceTicks(domain[0], domain[1], 6).filter(Number.isInteger)) {
    svgEl("text", {x: sx(t), y: H - B + 14, "text-anchor": "middle"}, axes).textContent = t;
  }
  svgEl("text", {x: W - R, y: H - 2, "text-anchor": "end", class: "xlabel"}, axes).textContent = options.xLabel || "rollout";
  const clip = `clip${Math.random().toString(36).slice(2)}`;
  svgEl("rect", {x: L, y: T, width: W - L - R, height: H - T - B}, svgEl("clipPath", {id: clip}, svg));
  const plot = svgEl("g", {"clip-path": `url(#${clip})`}, svg);
  series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    if (stackedTop) {
      const top = stackedTop[i].map(([x, , y]) => `${sx(x)},${sy(y)}`);
      const bottom = stackedTop[i].slice().reverse().map(([x, y]) => `${sx(x)},${sy(y)}`);
      svgEl("polygon", {points: top.concat(bottom).join(" "), fill: color, "fill-opacity": 0.55, stroke: color}, plot);
    } else {
      svgEl("polyline", {points: s.points.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" "), fill: "none", stroke: color,
        "stroke-width": 1.6, "stroke-dasharray": s.dashed ? "5 3" : ""}, plot);
    }
    s.points.forEach(([x, y], j) => {
      const yy = stackedTop ? stackedTop[i][j][2] : y;
      svgEl("circle", {cx: sx(x), cy: sy(yy), r: 2.2, fill: color, class: "pt", "data-series": s.name, "data-x": x}, plot);
    });
  });
  const legend = document.createElement("div");
  legend.className = "legend";
  series.forEach((s, i) => {
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${s.color || PALETTE[i % PALETTE.length]}"></i>`;
    item.append(s.name);
    legend.appendChild(item);
  });
  figure.appendChild(legend);

  // hover: a rule at the nearest x and every series' value there
  const rule = svgEl("line", {y1: T, y2: H - B, class: "rule", visibility: "hidden"}, svg);
  const band = svgEl("rect", {y: T, height: H - T - B, class: "band", visibility: "hidden"}, svg);
  const tip = document.getElementById("tooltip");
  const toX = (event) => {
    const box = svg.getBoundingClientRect();
    const px = ((event.clientX - box.left) / box.width) * W;
    return domain[0] + ((px - L) / (W - L - R)) * span;
  };
  let dragFrom = null;
  svg.addEventListener("mousemove", (event) => {
    const x = toX(event);
    if (dragFrom !== null) {
      band.setAttribute("x", Math.min(sx(dragFrom), sx(x)));
      band.setAttribute("width", Math.abs(sx(x) - sx(dragFrom)));
      band.setAttribute("visibility", "visible");
    }
    const near = xs.reduce((a, b) => (Math.abs(b - x) < Math.abs(a - x) ? b : a));
    rule.setAttribute("x1", sx(near)); rule.setAttribute("x2", sx(near));
    rule.setAttribute("visibility", "visible");
    const lines = series.map((s) => {
      const p = s.points.find((q) => q[0] === near);
      return `${s.name}: ${p ? fmt(p[1]) : "–"}`;
    });
    tip.textContent = `${options.xLabel || "rollout"} ${near}\n${lines.join("\n")}`;
    tip.hidden = false;
    tip.style.left = `${event.pageX + 12}px`;
    tip.style.top = `${event.pageY + 12}px`;
  });
  svg.addEventListener("mouseleave", () => {
    rule.setAttribute("visibility", "hidden"); band.setAttribute("visibility", "hidden");
    tip.hidden = true; dragFrom = null;
  });
  svg.addEventListener("mousedown", (event) => { dragFrom = toX(event); event.preventDefault(); });
  svg.addEventListener("mouseup", (event) => {
    if (dragFrom === null) return;
    const to = toX(event);
    const from = dragFrom;
    dragFrom = null;
    if (Math.abs(sx(to) - sx(from)) > 6) {
      figure._zoom = [Math.min(from, to), Math.max(from, to)];
      drawChart(figure, series, options);
    }
  });
  svg.addEventListener("dblclick", () => { figure._zoom = null; drawChart(figure, series, options); });
  if (figure._zoom) figure.classList.add("zoomed"); else figure.classList.remove("zoomed");
}

window.drawChart = drawChart;
window.fmt = fmt;
window.PALETTE = PALETTE;
