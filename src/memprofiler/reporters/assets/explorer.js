
(async function () {
"use strict";
const $ = (id) => document.getElementById(id);
const META = JSON.parse($("mp-meta").textContent);
const STR = META.strings;
const TYPES = {i8: Int8Array, i32: Int32Array, f32: Float32Array, f64: Float64Array};
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
function fmtB(n) {
  let v = Math.abs(n), u = 0;
  while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
  return (n < 0 ? "-" : "") + (u === 0 ? String(Math.floor(v)) + " B" : v.toFixed(2) + " " + UNITS[u]);
}
const fmtN = (n) => Math.round(n).toLocaleString("en-US");
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const PALETTE = ["#4E79A7", "#F28E2B", "#59A14F", "#E15759", "#76B7B2", "#EDC948", "#B07AA1", "#FF9DA7",
  "#9C755F", "#86BCB6", "#D37295", "#A0CBE8", "#FFBE7D", "#8CD17D", "#B6992D", "#499894", "#F1CE63", "#D4A6C8"];

async function unpack() {
  const text = $("mp-data").textContent.trim();
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  const buf = await new Response(stream).arrayBuffer();
  const out = {};
  for (const [name, [type, off, count]] of Object.entries(META.arrays)) out[name] = new TYPES[type](buf, off, count);
  return out;
}

const A = await unpack();
const PY = 1, USER = 2, INTERNAL = 4, ROLE = 32;
const frameKind = A.frameKind, stackOff = A.stackOffsets, stackFr = A.stackFrames, stackLabel = A.stackLabel;
function frameText(f) {
  const kind = frameKind[f], name = STR[A.frameName[f]], file = STR[A.frameFile[f]];
  if (kind & ROLE) return name;  // a block's role (parameter, optimizer state...), not a frame
  if (kind & PY) return name + " (" + file.split("/").pop() + ":" + A.frameLine[f] + ")";
  const short = name.replace(/\(.*\)(\s*(const|\[clone [^\]]*\]))*\s*$/, "") || name;
  const base = file.split("/").pop();
  return base && base !== "??" ? short + " (" + base + ")" : short;
}
// Frames shown for a stack: Python first, then C++ frames, internal ones left out (all, raw, when asked).
function shownFrames(s, all) {
  const out = [];
  if (all) { for (let i = stackOff[s]; i < stackOff[s + 1]; i++) out.push(stackFr[i]); return out; }
  for (let i = stackOff[s]; i < stackOff[s + 1]; i++) { const k = frameKind[stackFr[i]]; if (k & PY && !(k & INTERNAL)) out.push(stackFr[i]); }
  for (let i = stackOff[s]; i < stackOff[s + 1]; i++) { const k = frameKind[stackFr[i]]; if (!(k & PY) && !(k & INTERNAL)) out.push(stackFr[i]); }
  if (!out.length) for (let i = stackOff[s]; i < stackOff[s + 1]; i++) out.push(stackFr[i]);
  return out;
}
function labelOf(s) { const f = stackLabel[s]; return f < 0 ? "(no stack recorded)" : frameText(f); }
const NO_STACK_COLOR = "#BAB0AC";
// Per stack, its colour: a palette index from its label frame (the last one: no stack).
const stackColor = new Uint8Array(stackLabel.length);
for (let s = 0; s < stackLabel.length; s++) stackColor[s] = stackLabel[s] < 0 ? PALETTE.length : (stackLabel[s] * 7919) % PALETTE.length;
const RECTS = Array.from({length: PALETTE.length + 1}, () => []);
function colorOf(s) { const c = stackColor[s]; return c < PALETTE.length ? PALETTE[c] : NO_STACK_COLOR; }

const DEV = META.devices.map((m, k) => {
  const g = (n) => A["d" + k + "." + n];
  const d = {meta: m, start: g("start"), end: g("end"), size: g("size"), addr: g("addr"), stack: g("stack"),
    stream: g("stream"), level: g("level"), band: g("band"), time: g("time"), segStart: g("segStart"),
    segEnd: g("segEnd"), segAddr: g("segAddr"), segSize: g("segSize"), segStream: g("segStream")};
  const n = m.instants, B = d.start.length, diff = new Float64Array(n + 1);
  for (let i = 0; i < B; i++) { diff[Math.max(d.start[i], 0)] += d.size[i]; diff[d.end[i]] -= d.size[i]; }
  d.total = new Float64Array(n);
  let cur = 0, peak = -Infinity, peakAt = 0;
  for (let t = 0; t < n; t++) { cur += diff[t]; d.total[t] = cur; if (cur > peak) { peak = cur; peakAt = t; } }
  d.peak = peak; d.peakAt = peakAt;
  d.levels = m.bandOffsets.length - 1;
  const sd = new Float64Array(n + 1);
  for (let i = 0; i < d.segStart.length; i++) { sd[Math.max(d.segStart[i], 0)] += d.segSize[i]; sd[d.segEnd[i]] -= d.segSize[i]; }
  d.reserved = new Float64Array(n); cur = 0;
  for (let t = 0; t < n; t++) { cur += sd[t]; d.reserved[t] = cur; }
  d.yMax = Math.max(peak, 1) * 1.06;
  // Drawable blocks by level, each level's in allocation (= start) order. A level-l block lives
  // 2**l to 2**(l+1) - 1 entries, so those alive after t0 start after t0 - 2**(l+1): a redraw
  // reads only the blocks near its view, not every block.
  let nLv = 0;
  for (let i = 0; i < B; i++) if (d.level[i] + 1 > nLv) nLv = d.level[i] + 1;
  const lvOff = new Int32Array(nLv + 1);
  for (let i = 0; i < B; i++) if (d.level[i] >= 0) lvOff[d.level[i] + 1]++;
  for (let l = 0; l < nLv; l++) lvOff[l + 1] += lvOff[l];
  const fill = lvOff.slice(0, nLv);
  d.lvOff = lvOff; d.lvIdx = new Int32Array(lvOff[nLv]); d.lvStart = new Int32Array(lvOff[nLv]);
  for (let i = 0; i < B; i++) {
    const l = d.level[i];
    if (l >= 0) { const k = fill[l]++; d.lvIdx[k] = i; d.lvStart[k] = Math.max(d.start[i], 0); }
  }
  return d;
});

const CALLS = META.calls || [];
const app = $("mp-app");
app.innerHTML = `
<div class="bar">
  <label>device <select id="mp-dev">${DEV.map((d, k) => `<option value="${k}">${d.meta.device}</option>`).join("")}</select></label>
  <button id="mp-reset">whole trace</button><button id="mp-gopeak">peak</button>${META.initial ? '<button id="mp-gooom">the OOM</button>' : ""}<button id="mp-zoomsel" disabled>zoom to selection</button>
  ${CALLS.length ? `<label>call <select id="mp-call"><option value="-1">whole recording</option>${CALLS.map((c, k) => `<option value="${k}">${esc(c.key)}</option>`).join("")}</select></label>` : ""}
  <label><input type="checkbox" id="mp-all"> show all frames</label>
  <span id="mp-view" class="muted"></span>
</div>
<div class="muted" style="font-size:12px">Wheel: zoom · drag: pan · shift+drag: select a range · click: select the instant and pin the block's stack.</div>
<canvas id="mp-main" aria-label="active memory timeline"></canvas>
<div id="mp-legend" class="mp-legend"></div>
<canvas id="mp-alloc" aria-label="reserved and allocated over time"></canvas>
<div class="bar"><span id="mp-instant"></span><span id="mp-range" class="muted"></span></div>
<div class="mp-cols">
  <div class="mp-panel"><h3>Live at the selected instant, by stack</h3><div id="mp-tree"></div></div>
  <div class="mp-panel"><h3>Pinned block</h3><div id="mp-pin" class="muted">Click a block to pin its stack.</div></div>
</div>
<div class="mp-panel" style="margin-top:12px"><h3>Allocator state at the selected instant</h3><div id="mp-state"></div>
  <div class="mp-segwrap"><canvas id="mp-segs" aria-label="segments and free gaps"></canvas></div></div>
<div id="mp-tip"></div>`;
$("mp-loading") && $("mp-loading").remove();

const S = {dev: 0, t0: 0, t1: 1, sel: 0, range: null, pin: -1, all: false};
const X = {firstPaintMs: null, lastDrawMs: null, draws: 0, drawn: 0, level: 0};
window.mpExplorer = X;
const main = $("mp-main"), allocC = $("mp-alloc"), tip = $("mp-tip");
const PAD_L = 70, PAD_B = 18;
let drawnIdx = new Int32Array(0), drawnN = 0, bandCol = null, topCol = null, colT = null;

function dev() { return DEV[S.dev]; }
// Resizing a canvas reallocates its bitmap: done only when its size changed, else it is cleared.
function sizeCanvas(c) {
  const r = c.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
  const cw = Math.max(1, Math.round(r.width * dpr)), ch = Math.max(1, Math.round(r.height * dpr));
  const ctx = c.getContext("2d");
  if (c.width !== cw || c.height !== ch) { c.width = cw; c.height = ch; }
  else { ctx.setTransform(1, 0, 0, 1, 0, 0); ctx.clearRect(0, 0, cw, ch); }
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return {ctx, w: r.width, h: r.height};
}
// Scratch typed arrays kept between redraws (a redraw allocates next to nothing, so the
// garbage collector does not pause a pan): at least n long, grown by half when short.
const SCRATCH = {};
function scratch(name, Type, n) {
  let a = SCRATCH[name];
  if (!a || a.length < n) a = SCRATCH[name] = new Type(Math.max(n, Math.ceil((a ? a.length : 0) * 1.5), 16));
  return a;
}
function plotW() { return main.getBoundingClientRect().width - PAD_L; }
function xOf(t) { return PAD_L + (t - S.t0) / (S.t1 - S.t0) * plotW(); }
function tOf(x) { return S.t0 + (x - PAD_L) / plotW() * (S.t1 - S.t0); }

function axes(ctx, w, h, yMax) {
  ctx.fillStyle = "#333"; ctx.font = "11px system-ui"; ctx.strokeStyle = "#eee"; ctx.lineWidth = 1;
  for (let k = 0; k <= 4; k++) {
    const y = (h - PAD_B) * (1 - k / 4);
    ctx.beginPath(); ctx.moveTo(PAD_L, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText(fmtB(yMax * k / 4), 2, Math.max(10, y));
  }
  const span = S.t1 - S.t0;
  for (let k = 0; k <= 6; k++) {
    const t = S.t0 + span * k / 6;
    ctx.fillText(fmtN(t), Math.min(w - 50, PAD_L + plotW() * k / 6), h - 4);
  }
}

// The stacked blocks: blocks drawn at this level in allocation order from the bottom, the band on top.
// The level is the lowest whose blocks are all at least a pixel column wide.
function draw() {
  const T0 = performance.now();
  const d = dev(), {ctx, w, h} = sizeCanvas(main);
  const W = Math.max(1, Math.floor(w - PAD_L)), H = h - PAD_B;
  const span = S.t1 - S.t0, ept = span / W;
  const L = Math.max(0, Math.min(d.levels - 1, Math.ceil(Math.log2(Math.max(ept, 1)))));
  X.level = L;
  const B = d.start.length, st = d.start, en = d.end, sz = d.size;
  if (drawnIdx.length < B) drawnIdx = new Int32Array(B);
  drawnN = 0;
  const t0 = Math.floor(S.t0), t1 = Math.ceil(S.t1);
  for (let l = L; l + 1 < d.lvOff.length; l++) {
    const b = d.lvOff[l + 1], lo = t0 - Math.pow(2, l + 1);
    let a = d.lvOff[l], z = b;
    while (a < z) { const m = (a + z) >> 1; if (d.lvStart[m] > lo) z = m; else a = m + 1; }
    for (let k = a; k < b && d.lvStart[k] <= t1; k++) { const i = d.lvIdx[k]; if (en[i] > t0) drawnIdx[drawnN++] = i; }
  }
  drawnIdx.subarray(0, drawnN).sort();
  X.drawn = drawnN;
  const ky = H / d.yMax;
  for (const arr of RECTS) arr.length = 0;
  const colorOrder = [];  // colours filled in the order first met, as blocks come bottom up
  const live = scratch("live", Int32Array, drawnN), posOf = scratch("posOf", Int32Array, drawnN);
  const liveCum = scratch("liveCum", Float64Array, drawnN);
  let nLive = 0;
  const curY = scratch("curY", Float64Array, drawnN).fill(NaN, 0, drawnN), segX = scratch("segX", Float64Array, drawnN);
  const dead = scratch("dead", Uint8Array, drawnN).fill(0, 0, drawnN);
  const flush = (p, x) => {
    if (isNaN(curY[p]) || x <= segX[p]) return;
    const c = stackColor[d.stack[drawnIdx[p]]], arr = RECTS[c];
    if (!arr.length) colorOrder.push(c);
    arr.push(PAD_L + segX[p], H - (curY[p] + sz[drawnIdx[p]]) * ky, x - segX[p], sz[drawnIdx[p]] * ky);
  };
  if (!colT || colT.length !== W) { bandCol = new Float64Array(W); topCol = new Float64Array(W); colT = new Int32Array(W); }
  const bOff = d.meta.bandOffsets[L], shift = Math.pow(2, L);
  for (let x = 0; x < W; x++) colT[x] = Math.min(d.meta.instants - 1, Math.max(0, Math.floor(S.t0 + (x + 0.5) * ept)));
  // Blocks in the order they end, bucketed by the first column whose instant reaches their end.
  const killAt = scratch("killAt", Int32Array, drawnN), killed = scratch("killed", Int32Array, drawnN);
  const cnt = scratch("killCount", Int32Array, W + 2).fill(0, 0, W + 2);
  for (let p = 0; p < drawnN; p++) {
    const e = en[drawnIdx[p]];
    let a = 0, z = W;
    while (a < z) { const m = (a + z) >> 1; if (colT[m] >= e) z = m; else a = m + 1; }
    killAt[p] = a; cnt[a + 1]++;
  }
  for (let x = 0; x <= W; x++) cnt[x + 1] += cnt[x];
  for (let p = 0; p < drawnN; p++) killed[cnt[killAt[p]]++] = p;
  let sp = 0, ep = 0;
  for (let x = 0; x < W; x++) {
    const t = colT[x];
    // Only the live blocks above the lowest one born or freed in this column move: restack those.
    let low = nLive;
    while (sp < drawnN && st[drawnIdx[sp]] <= t) {
      if (en[drawnIdx[sp]] > t) { posOf[sp] = nLive; live[nLive++] = sp; segX[sp] = x; } else dead[sp] = 1;
      sp++;
    }
    while (ep < drawnN && killAt[killed[ep]] <= x) {
      const p = killed[ep];
      if (!dead[p] && p < sp) { flush(p, x); dead[p] = 1; if (posOf[p] < low) low = posOf[p]; }
      dead[p] = 1; ep++;
    }
    if (low < nLive) {
      let k = low, cum = low > 0 ? liveCum[low - 1] + sz[drawnIdx[live[low - 1]]] : 0;
      for (let j = low; j < nLive; j++) {
        const p = live[j];
        if (dead[p]) continue;
        live[k] = p; posOf[p] = k; liveCum[k] = cum; k++;
        if (curY[p] !== cum) { flush(p, x); segX[p] = x; curY[p] = cum; }
        cum += sz[drawnIdx[p]];
      }
      nLive = k;
    }
    topCol[x] = nLive ? liveCum[nLive - 1] + sz[drawnIdx[live[nLive - 1]]] : 0;
    bandCol[x] = d.band[bOff + Math.floor(t / shift)] || 0;
  }
  for (let j = 0; j < nLive; j++) flush(live[j], W);
  for (const c of colorOrder) {
    const arr = RECTS[c];
    ctx.fillStyle = c < PALETTE.length ? PALETTE[c] : NO_STACK_COLOR; ctx.beginPath();
    for (let i = 0; i < arr.length; i += 4) ctx.rect(arr[i], arr[i + 1], Math.max(arr[i + 2], 0.5), Math.max(arr[i + 3], 0.5));
    ctx.fill();
  }
  ctx.fillStyle = "rgba(120,120,120,0.55)"; ctx.beginPath(); ctx.moveTo(PAD_L, H - topCol[0] * ky);
  for (let x = 0; x < W; x++) { ctx.lineTo(PAD_L + x, H - (topCol[x] + bandCol[x]) * ky); ctx.lineTo(PAD_L + x + 1, H - (topCol[x] + bandCol[x]) * ky); }
  for (let x = W - 1; x >= 0; x--) { ctx.lineTo(PAD_L + x + 1, H - topCol[x] * ky); ctx.lineTo(PAD_L + x, H - topCol[x] * ky); }
  ctx.closePath(); ctx.fill();
  axes(ctx, w, h, d.yMax);
  for (const [i] of d.meta.ooms) mark(ctx, xOf(i + 0.5), H, "#D00", "OOM");
  X.peakLabel = mark(ctx, xOf(d.meta.peakIndex + 0.5), H, "#D55E00", "peak " + fmtB(d.meta.peak));
  mark(ctx, xOf(S.sel + 0.5), H, "#000", "");
  if (S.range) { ctx.fillStyle = "rgba(0,114,178,0.12)"; ctx.fillRect(xOf(S.range[0]), 0, xOf(S.range[1]) - xOf(S.range[0]), H); }
  drawAlloc();
  $("mp-view").textContent = "entries " + fmtN(S.t0) + " - " + fmtN(S.t1) + " of " + fmtN(d.meta.entries) +
    " · " + fmtN(drawnN) + " blocks drawn, level " + L + " (smaller or shorter ones in the grey band)";
  X.view = [S.t0, S.t1]; X.lastDrawMs = performance.now() - T0; X.draws++;
}
function mark(ctx, x, H, color, text) {
  if (x < PAD_L || x > PAD_L + plotW()) return;
  ctx.strokeStyle = color; ctx.lineWidth = 1; ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, H); ctx.stroke();
  if (!text) return null;
  ctx.fillStyle = color; ctx.font = "600 11px system-ui";
  // Right of the line, or left of it where the text would run past the plot's right edge.
  const tw = ctx.measureText(text).width, right = PAD_L + plotW();
  const tx = x + 3 + tw <= right ? x + 3 : Math.max(PAD_L, x - 3 - tw);
  ctx.fillText(text, tx, 12);
  return [tx, tx + tw, right];
}
// Reserved (segments) against active bytes, on the same time axis.
function drawAlloc() {
  const d = dev(), {ctx, w, h} = sizeCanvas(allocC), H = h - PAD_B, W = colT.length;
  let yMax = 1;
  for (let x = 0; x < W; x++) yMax = Math.max(yMax, d.reserved[colT[x]], d.total[colT[x]]);
  yMax *= 1.08;
  axes(ctx, w, h, yMax);
  for (const [arr, color] of [[d.reserved, "#CC79A7"], [d.total, "#0072B2"]]) {
    ctx.strokeStyle = color; ctx.lineWidth = 1.5; ctx.beginPath();
    for (let x = 0; x < W; x++) ctx.lineTo(PAD_L + x, H - arr[colT[x]] / yMax * H);
    ctx.stroke();
  }
  ctx.font = "11px system-ui"; ctx.fillStyle = "#CC79A7"; ctx.fillText("reserved", PAD_L + 6, 12);
  ctx.fillStyle = "#0072B2"; ctx.fillText("allocated (active, requested)", PAD_L + 70, 12);
  mark(ctx, xOf(S.sel + 0.5), H, "#000", "");
}

// Which drawn block (or the band) is under a point of the main canvas.
function hit(cx, cy) {
  const d = dev(), r = main.getBoundingClientRect(), x = Math.floor(cx - r.left - PAD_L);
  if (!colT || x < 0 || x >= colT.length) return null;
  const H = r.height - PAD_B, bytes = (H - (cy - r.top)) / H * d.yMax, t = colT[x];
  if (bytes < 0) return null;
  let cum = 0;
  for (let p = 0; p < drawnN; p++) {
    const i = drawnIdx[p];
    if (d.start[i] <= t && t < d.end[i]) {
      if (bytes < cum + d.size[i]) return {block: i, t};
      cum += d.size[i];
    }
  }
  if (bytes < cum + bandCol[x]) return {band: bandCol[x], t};
  return {t};
}
function lifetime(d, i) {
  const s = d.start[i], e = d.end[i], n = d.meta.entries;
  const from = s < 0 ? "before the trace" : "entry " + fmtN(s);
  const to = e >= d.meta.instants ? "still alive at the snapshot" : "freed at entry " + fmtN(e);
  let dt = "";
  if (s >= 0 && e < n && d.time[e] && d.time[s]) dt = ", " + ((d.time[e] - d.time[s]) / 1000).toFixed(3) + " ms";
  return from + " → " + to + (s >= 0 ? " (" + fmtN(e - s) + " entries" + dt + ")" : "");
}
function tipFor(h) {
  const d = dev();
  if (h.block !== undefined) {
    const i = h.block;
    return `<b class="mp-size">${esc(fmtB(d.size[i]))}</b> <span class="muted">(${fmtN(d.size[i])} bytes)</span><br>` +
      `<span class="mp-frame">${esc(labelOf(d.stack[i]))}</span><br><span class="muted">${esc(lifetime(d, i))}</span>`;
  }
  if (h.band !== undefined) return `<b>${esc(fmtB(h.band))}</b> in blocks too small or too short to draw at this zoom (zoom in)`;
  return `entry ${fmtN(h.t)}: ${esc(fmtB(d.total[h.t]))} active`;
}

let drag = null;
main.addEventListener("mousemove", (ev) => {
  if (drag) {
    const dx = ev.clientX - drag.x;
    if (Math.abs(dx) > 2) drag.moved = true;
    if (drag.shift) { S.range = [Math.min(drag.t, tOf(ev.clientX - main.getBoundingClientRect().left)), Math.max(drag.t, tOf(ev.clientX - main.getBoundingClientRect().left))]; schedule(); }
    else if (drag.moved) { const dt = dx / plotW() * (drag.t1 - drag.t0); setView(drag.t0 - dt, drag.t1 - dt); }
    return;
  }
  const h = hit(ev.clientX, ev.clientY);
  if (!h) { tip.style.display = "none"; return; }
  tip.innerHTML = tipFor(h); tip.style.display = "block";
  tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 420) + "px"; tip.style.top = (ev.clientY + 14) + "px";
});
main.addEventListener("mouseleave", () => { tip.style.display = "none"; });
main.addEventListener("mousedown", (ev) => {
  drag = {x: ev.clientX, t0: S.t0, t1: S.t1, shift: ev.shiftKey, moved: false, t: tOf(ev.clientX - main.getBoundingClientRect().left)};
});
window.addEventListener("mouseup", (ev) => {
  if (!drag) return;
  const dd = drag; drag = null;
  if (dd.shift && dd.moved) { rangeSelected(); return; }
  if (dd.moved) return;
  const h = hit(ev.clientX, ev.clientY);
  if (!h) return;
  S.sel = h.t; S.pin = h.block !== undefined ? h.block : -1;
  schedule(); panels();
});
main.addEventListener("wheel", (ev) => {
  ev.preventDefault();
  const f = Math.exp(ev.deltaY * 0.0015), tm = tOf(ev.clientX - main.getBoundingClientRect().left);
  setView(tm - (tm - S.t0) * f, tm + (S.t1 - tm) * f);
}, {passive: false});
function setView(a, b) {
  const n = dev().meta.instants, minSpan = Math.min(n, 8);
  let span = Math.max(minSpan, Math.min(n, b - a));
  a = Math.max(0, Math.min(n - span, a));
  S.t0 = a; S.t1 = a + span; schedule();
}
let pending = false;
function schedule() { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; draw(); }); } }

function rangeSelected() {
  const d = dev(), a = Math.max(0, Math.floor(S.range[0])), b = Math.min(d.meta.instants - 1, Math.ceil(S.range[1]));
  let pk = -1, at = a, allocs = 0, bytes = 0;
  for (let t = a; t <= b; t++) if (d.total[t] > pk) { pk = d.total[t]; at = t; }
  for (let i = 0; i < d.start.length; i++) if (d.start[i] >= a && d.start[i] <= b) { allocs++; bytes += d.size[i]; }
  $("mp-range").textContent = "selection: entries " + fmtN(a) + " - " + fmtN(b) + ", peak " + fmtB(pk) + " at entry " +
    fmtN(at) + ", " + fmtN(allocs) + " allocations of " + fmtB(bytes) + " in total";
  $("mp-zoomsel").disabled = false;
  S.sel = at; schedule(); panels();
}

// ---- live at the instant, as a tree: the label frame, then its callers outward
function tree() {
  const d = dev(), t = S.sel, byStack = new Map();
  let total = 0, blocks = 0;
  for (let i = 0; i < d.start.length; i++) if (d.start[i] <= t && t < d.end[i]) {
    const s = d.stack[i], g = byStack.get(s) || {bytes: 0, count: 0};
    g.bytes += d.size[i]; g.count++; byStack.set(s, g); total += d.size[i]; blocks++;
  }
  const root = {kids: new Map(), bytes: total, count: blocks};
  for (const [s, g] of byStack) {
    let path;
    if (stackLabel[s] < 0) path = [-1];
    else { const fr = shownFrames(s, S.all); let k = S.all ? 0 : Math.max(0, fr.indexOf(stackLabel[s])); path = fr.slice(k); }
    let node = root;
    for (const f of path) {
      let kid = node.kids.get(f);
      if (!kid) node.kids.set(f, kid = {f, kids: new Map(), bytes: 0, count: 0, stack: s});
      kid.bytes += g.bytes; kid.count += g.count; node = kid;
    }
  }
  X.treeTotal = total; X.treeTop = [...byStack.entries()].sort((a, b) => b[1].bytes - a[1].bytes).slice(0, 20).map(([s, g]) => [labelOf(s), g.bytes]);
  const el = $("mp-tree");
  el.innerHTML = `<div>entry ${fmtN(t)}${d.time[t] ? " (t=" + (d.time[t] / 1e6).toFixed(6) + " s)" : ""}: ` +
    `<b id="mp-tree-total" data-bytes="${total}">${esc(fmtB(total))}</b> live in ${fmtN(blocks)} blocks</div>`;
  el.appendChild(treeList(root, total, 0));
}
function treeList(node, total, depth) {
  const ul = document.createElement("ul"); ul.className = "mp-tree";
  const kids = [...node.kids.values()].sort((a, b) => b.bytes - a.bytes);
  const shown = kids.slice(0, 200);
  for (const k of shown) {
    const li = document.createElement("li");
    const share = total ? k.bytes / total : 0;
    const name = k.f < 0 ? "(no stack recorded)" : frameText(k.f);
    li.innerHTML = `<div class="row"><span>${k.kids.size ? "▸" : "·"}</span><span class="num">${esc(fmtB(k.bytes))} ${(share * 100).toFixed(1)}%</span>` +
      `<span class="share" style="width:${Math.round(share * 120)}px"></span><span class="fr" title="${esc(name)}">${esc(name)}</span>` +
      `<span class="muted">${fmtN(k.count)} blocks</span></div>`;
    const row = li.firstChild;
    let open = false, sub = null;
    const toggle = () => {
      if (!k.kids.size) { showStack(k.stack, null); return; }
      open = !open; row.firstChild.textContent = open ? "▾" : "▸";
      if (open) { sub = treeList(k, total, depth + 1); li.appendChild(sub); } else if (sub) { sub.remove(); sub = null; }
    };
    row.addEventListener("click", toggle);
    ul.appendChild(li);
    if (share >= 0.2 && depth < 4 && k.kids.size) toggle();
  }
  if (kids.length > shown.length) { const li = document.createElement("li"); li.className = "muted"; li.textContent = (kids.length - shown.length) + " smaller entries"; ul.appendChild(li); }
  return ul;
}

function showStack(s, block) {
  const d = dev(), el = $("mp-pin");
  let head = "";
  if (block !== null && block >= 0) head = `<div><b>${esc(fmtB(d.size[block]))}</b> (${fmtN(d.size[block])} bytes) at ${esc("0x" + d.addr[block].toString(16))}, stream ${d.stream[block]}<br><span class="muted">${esc(lifetime(d, block))}</span></div>`;
  const fr = shownFrames(s, S.all);
  const lines = fr.map((f) => {
    const k = frameKind[f], cls = k & USER ? "user" : k & INTERNAL ? "internal" : k & PY ? "py" : "cpp";
    return `<div class="${cls}">${esc(frameText(f))}</div>`;
  });
  const hidden = stackOff[s + 1] - stackOff[s] - fr.length;
  el.className = "";
  el.innerHTML = head + `<div>label: <b>${esc(labelOf(s))}</b></div><div class="mp-stack">${lines.join("") || "(no stack recorded)"}</div>` +
    (hidden > 0 ? `<div class="muted">${hidden} internal frames hidden (show all frames)</div>` : "");
}

// ---- allocator state at the instant: segments, the blocks in them, free gaps, per stream
function state() {
  const d = dev(), t = S.sel, segs = [];
  for (let k = 0; k < d.segStart.length; k++) if (d.segStart[k] <= t && t < d.segEnd[k]) segs.push(k);
  segs.sort((a, b) => d.segAddr[a] - d.segAddr[b]);
  const inSeg = segs.map(() => []);
  let outside = 0;
  for (let i = 0; i < d.start.length; i++) if (d.start[i] <= t && t < d.end[i]) {
    const a = d.addr[i];
    let lo = 0, hi = segs.length - 1, found = -1;
    while (lo <= hi) { const mid = (lo + hi) >> 1; if (d.segAddr[segs[mid]] <= a) { found = mid; lo = mid + 1; } else hi = mid - 1; }
    if (found >= 0 && a < d.segAddr[segs[found]] + d.segSize[segs[found]]) inSeg[found].push(i); else outside += d.size[i];
  }
  const streams = new Map(), rows = [];
  segs.forEach((k, j) => {
    const blocks = inSeg[j].sort((a, b) => d.addr[a] - d.addr[b]);
    let used = 0, largest = 0, pos = d.segAddr[k];
    for (const i of blocks) { largest = Math.max(largest, d.addr[i] - pos); pos = Math.max(pos, d.addr[i] + d.size[i]); used += d.size[i]; }
    largest = Math.max(largest, d.segAddr[k] + d.segSize[k] - pos);
    const free = d.segSize[k] - used;
    rows.push({k, blocks, used, free, largest});
    const st = streams.get(d.segStream[k]) || {segs: 0, reserved: 0, used: 0, free: 0, largest: 0};
    st.segs++; st.reserved += d.segSize[k]; st.used += used; st.free += free; st.largest = Math.max(st.largest, largest);
    streams.set(d.segStream[k], st);
  });
  const frag = (free, largest) => free > 0 ? ((1 - largest / free) * 100).toFixed(1) + "%" : "0.0%";
  let html = `<p>entry ${fmtN(t)}: reserved <b>${esc(fmtB(d.reserved[t]))}</b>, allocated (requested) <b>${esc(fmtB(d.total[t]))}</b>` +
    (outside ? `, ${esc(fmtB(outside))} in blocks outside any known segment` : "") + `.</p>` +
    `<table><thead><tr><th>stream</th><th>segments</th><th>reserved</th><th>allocated</th><th>free in segments</th><th>largest free block</th><th>fragmentation</th></tr></thead><tbody>` +
    [...streams.entries()].map(([s, v]) => `<tr><td>${s}</td><td class="n">${fmtN(v.segs)}</td><td class="n">${esc(fmtB(v.reserved))}</td><td class="n">${esc(fmtB(v.used))}</td>` +
      `<td class="n">${esc(fmtB(v.free))}</td><td class="n">${esc(fmtB(v.largest))}</td><td class="n">${frag(v.free, v.largest)}</td></tr>`).join("") +
    `</tbody></table><p class="muted">Fragmentation = 1 - largest free block / free bytes. Blocks are placed by their requested size, so a gap includes the allocator's rounding. Below: every segment (rows, by stream and address), blocks coloured by label, free gaps white.</p>`;
  $("mp-state").innerHTML = html;
  rows.sort((a, b) => d.segStream[a.k] - d.segStream[b.k] || d.segAddr[a.k] - d.segAddr[b.k]);
  const c = $("mp-segs"), rowH = rows.length > 150 ? 3 : 8;
  c.style.height = Math.max(20, rows.length * rowH) + "px";
  const {ctx, w} = sizeCanvas(c);
  let maxSeg = 1;
  for (const r of rows) maxSeg = Math.max(maxSeg, d.segSize[r.k]);
  rows.forEach((r, j) => {
    const y = j * rowH, sc = (w - 2) / maxSeg, base = d.segAddr[r.k];
    ctx.fillStyle = "#f4f4f4"; ctx.fillRect(1, y, d.segSize[r.k] * sc, rowH - 1);
    for (const i of r.blocks) { ctx.fillStyle = colorOf(d.stack[i]); ctx.fillRect(1 + (d.addr[i] - base) * sc, y, Math.max(d.size[i] * sc, 0.5), rowH - 1); }
  });
  X.state = {segments: rows.length, reserved: d.reserved[t], streams: [...streams.keys()]};
}

// What the timeline's colours mean: the largest stacks live at the selected instant, each in
// its colour (colours follow a stack's label frame), then the grey band and the unknown stacks.
function legend() {
  const d = dev(), t = S.sel, by = new Map();
  for (let i = 0; i < d.start.length; i++) {
    if (d.start[i] <= t && d.end[i] > t) { const s = d.stack[i], f = stackLabel[s]; const g = by.get(f); if (g) g[1] += d.size[i]; else by.set(f, [s, d.size[i]]); }
  }
  const top = [...by.values()].sort((a, b) => b[1] - a[1]).slice(0, 8);
  const key = (color, text) => `<span class="mp-key"><i style="background:${color}"></i>${esc(text)}</span>`;
  $("mp-legend").innerHTML = "<b>colours</b> (at the selected instant): " +
    top.map(([s, b]) => key(colorOf(s), labelOf(s) + " " + fmtB(b))).join("") +
    key("rgba(120,120,120,0.55)", "smaller or shorter blocks (grey band)") +
    key("#CC79A7", "reserved (lower chart)") + key("#0072B2", "active (lower chart)");
  X.legend = top.map(([s, b]) => [labelOf(s), colorOf(s), b]);
}
function panels() {
  const d = dev();
  $("mp-instant").innerHTML = `selected: entry <b>${fmtN(S.sel)}</b>, ${esc(fmtB(d.total[S.sel]))} active, ${esc(fmtB(d.reserved[S.sel]))} reserved`;
  tree(); state(); legend();
  if (S.pin >= 0) showStack(d.stack[S.pin], S.pin);
  X.sel = S.sel; X.pin = S.pin;
}
// The page opens on the OOM when the history holds one (META.initial), else on the whole trace.
function selectDevice(k, at) {
  S.dev = k; const d = dev();
  S.t0 = 0; S.t1 = d.meta.instants; S.sel = d.meta.peakIndex; S.pin = -1; S.range = null;
  if (at) { S.t0 = at.t0; S.t1 = at.t1; S.sel = at.sel; }
  $("mp-dev").value = String(k);
  X.peak = d.peak; X.peakAt = d.peakAt; X.device = d.meta.device;
  draw(); panels();
}
$("mp-dev").addEventListener("change", (e) => selectDevice(+e.target.value));
$("mp-reset").addEventListener("click", () => setView(0, dev().meta.instants));
$("mp-gopeak").addEventListener("click", () => { S.sel = dev().meta.peakIndex; schedule(); panels(); });
if (META.initial) $("mp-gooom").addEventListener("click", () => selectDevice(META.initial.device, META.initial));
$("mp-zoomsel").addEventListener("click", () => { if (S.range) setView(S.range[0], S.range[1]); });
$("mp-all").addEventListener("change", (e) => { S.all = e.target.checked; panels(); });
// A collected call marked in the recording: its entries shaded, zoomed to, summarised.
function selectCall(k) {
  const c = CALLS[k], r = c && c.ranges[String(dev().meta.device)];
  X.call = c ? c.key : null;
  if (!r) { S.range = null; $("mp-range").textContent = c ? "call " + c.key + ": no entries on this device" : ""; setView(0, dev().meta.instants); return; }
  S.range = [r[0], Math.max(r[0], r[1] - 1)];
  rangeSelected();
  $("mp-range").textContent = "call " + c.key + ": " + $("mp-range").textContent.replace(/^selection: /, "");
  const pad = Math.max(4, (r[1] - r[0]) * 0.05);
  setView(r[0] - pad, r[1] + pad);
  X.callRange = r.slice();
}
if (CALLS.length) $("mp-call").addEventListener("change", (e) => selectCall(+e.target.value));
window.addEventListener("resize", schedule);
// For tests and benchmarks: where a block is drawn now, and a way to set the view.
X.locate = (i) => {
  const d = dev(), r = main.getBoundingClientRect(), H = r.height - PAD_B, cols = [];
  for (let x = 0; x < colT.length; x++) if (d.start[i] <= colT[x] && colT[x] < d.end[i]) cols.push(x);
  if (!cols.length) return null;
  const x = cols[cols.length >> 1], t = colT[x];
  let cum = 0;
  for (let p = 0; p < drawnN; p++) {
    const j = drawnIdx[p];
    if (j === i) return {x: r.left + PAD_L + x + 0.5, y: r.top + H - (cum + d.size[i] / 2) / d.yMax * H};
    if (d.start[j] <= t && t < d.end[j]) cum += d.size[j];
  }
  return null;
};
X.setView = (a, b) => { setView(a, b); };
X.redraw = () => { draw(); return X.lastDrawMs; };
X.blockCount = () => dev().start.length;
X.drawnBlocks = () => Array.from(drawnIdx.subarray(0, drawnN));
X.block = (i) => { const d = dev(); return {size: d.size[i], start: d.start[i], end: d.end[i], label: labelOf(d.stack[i])}; };
selectDevice(META.initial ? META.initial.device : 0, META.initial);
if (META.select) { const k = CALLS.findIndex((c) => c.key === META.select); if (k >= 0) { $("mp-call").value = String(k); selectCall(k); } }
X.firstPaintMs = performance.now();
// Once the page shows, redraw a few zoom levels off screen so the browser compiles the timeline's
// loops before the first pan or zoom (a cold redraw of a million-entry trace took 2-4x longer).
setTimeout(() => {
  const n = dev().meta.instants, keep = [S.t0, S.t1];
  for (const [a, b] of [[0, n], [n / 4, n / 2], [n / 2, n / 2 + n / 64], [0, n]]) { S.t0 = a; S.t1 = b; draw(); }
  S.t0 = keep[0]; S.t1 = keep[1]; draw();
  X.draws = 1; X.warmMs = performance.now() - X.firstPaintMs; X.ready = true;
}, 0);
})().catch((err) => { console.error("allocation explorer: " + (err && err.stack || err)); });
