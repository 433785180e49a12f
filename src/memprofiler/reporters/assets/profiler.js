
(function () {
  function fmtBytes(n) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"], sign = n < 0 ? "-" : "", v = Math.abs(n);
    for (var i = 0; i < units.length; i++) {
      if (v < 1024 || i === units.length - 1) return i === 0 ? sign + Math.trunc(v) + " B" : sign + v.toFixed(2) + " " + units[i];
      v /= 1024;
    }
  }
  function esc(s) { var d = document.createElement("div"); d.textContent = s; return d.innerHTML; }
  function td(text, v, num) {
    return "<td" + (num === false ? "" : " class=n") + (v === undefined ? "" : " data-v='" + esc(String(v)) + "'") + ">" + esc(text) + "</td>";
  }
  function bytes(n) { return td(fmtBytes(n), n); }
  function num(n) { return td(n.toLocaleString("en-US"), n); }
  function ms(v) { return v === null ? td("-", "") : td(v.toLocaleString("en-US", {minimumFractionDigits: 3, maximumFractionDigits: 3}), v); }
  function widen(d, lo, hi) {
    // binned data: the first and last bin the range touches, and the range they cover
    if (!d.bins) return {lo: lo, hi: hi};
    var i = 0, j = d.bins.length - 1;
    while (i <= j && d.bins[i][1] < lo) i++;
    while (j >= i && d.bins[j][0] > hi) j--;
    if (i > j) return {lo: lo, hi: hi, i: i, j: j};
    return {lo: lo === -Infinity ? lo : d.bins[i][0], hi: hi === Infinity ? hi : d.bins[j][1], i: i, j: j};
  }
  function stats(d, lo, hi) {
    var rows = {}, w = widen(d, lo, hi);
    function add(stack, inc, cnt, size) {
      d.stacks[stack].forEach(function (n, k) {
        var r = rows[n] || (rows[n] = {name: d.names[n], n: n, calls: 0, inc: 0, sinc: 0, cnt: 0, scnt: 0, size: 0, ssize: 0});
        r.inc += inc; r.cnt += cnt; r.size += size;
        if (k === 0) { r.sinc += inc; r.scnt += cnt; r.ssize += size; }
      });
    }
    if (d.bins) {
      d.groups.forEach(function (g) { if (g[0] >= w.i && g[0] <= w.j) add(g[1], g[2], g[3], g[4]); });
    } else {
      d.events.forEach(function (e) {
        if (e[0] < lo || e[0] > hi) return;
        add(e[2], e[1], e[1] > 0 ? 1 : 0, e[1] > 0 ? e[1] : 0);
      });
    }
    var out = Object.keys(rows).map(function (k) { return rows[k]; });
    out.forEach(function (r) {
      if (!d.bins) { r.calls = d.calls[r.n].filter(function (t) { return t >= lo && t <= hi; }).length; return; }
      // slots: 2i inside bin i, 2i+1 between bins i and i+1, -1 before the first
      var a = lo === -Infinity ? -1 : 2 * w.i, b = hi === Infinity ? 2 * d.bins.length : 2 * w.j;
      r.calls = d.calls[r.n].reduce(function (s, c) { return c[0] >= a && c[0] <= b ? s + c[1] : s; }, 0);
    });
    out.sort(function (a, b) { return b.inc - a.inc || b.size - a.size || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0); });
    return out;
  }
  function select(view, lo, hi) {
    var d = JSON.parse(view.querySelector("script.memdata").textContent);
    var st = stats(d, lo, hi).map(function (r) {
      return "<tr>" + td(r.name, undefined, false) + num(r.calls) + bytes(r.inc) + bytes(r.sinc) + num(r.cnt) + num(r.scnt) + bytes(r.size) + bytes(r.ssize) + "</tr>";
    });
    view.querySelector("table[data-kind=stats] tbody").innerHTML = st.join("");
    var w = widen(d, lo, hi);
    lo = w.lo; hi = w.hi;
    var inr = function (t) { return t !== null && t >= lo && t <= hi; };
    var ps = d.pairs.filter(function (p) { return inr(p[2]) || inr(p[3]); });
    var shown = ps.slice().sort(function (a, b) { return b[1] - a[1]; }).slice(0, d.rows);
    view.querySelector("table[data-kind=pairs] tbody").innerHTML = shown.map(function (p) {
      var dur = p[2] !== null && p[3] !== null ? p[3] - p[2] : null;
      return "<tr>" + td(p[0], undefined, false) + bytes(p[1]) + ms(p[2]) + ms(p[3]) + ms(dur) + "</tr>";
    }).join("");
    var more = ps.length - shown.length;
    view.querySelector("p.more").textContent = more > 0 ? more.toLocaleString("en-US") + " smaller ones not shown." : "";
    view.querySelector("p.range").textContent = "Selected " + lo.toFixed(3) + " to " + hi.toFixed(3) + " ms: " + ps.length + " allocations and releases.";
  }
  window.memprofilerSelectRange = function (id, lo, hi) { select(document.getElementById(id), lo, hi); };
  document.querySelectorAll("div.memview").forEach(function (view) {
    if (!view.querySelector("script.memdata")) return;
    var svgEl = view.querySelector("svg.plot");
    view.querySelector("button.reset").addEventListener("click", function () { select(view, -Infinity, Infinity); });
    if (!svgEl) return;  // a curve of one or two points is a table: nothing to drag across
    var frame = svgEl.querySelector("rect.frame");
    var lo = parseFloat(view.dataset.lo), hi = parseFloat(view.dataset.hi), start = null, band = null;
    function toMs(ev) {
      var r = frame.getBoundingClientRect(), f = Math.min(1, Math.max(0, (ev.clientX - r.left) / r.width));
      return lo + f * (hi - lo);
    }
    svgEl.addEventListener("mousedown", function (ev) { start = toMs(ev); ev.preventDefault(); });
    svgEl.addEventListener("mouseup", function (ev) {
      if (start === null) return;
      var end = toMs(ev), a = Math.min(start, end), b = Math.max(start, end);
      start = null;
      if (b > a) select(view, a, b);
    });
  });
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th").forEach(function (th, col) {
      th.style.cursor = "pointer";
      th.addEventListener("click", function () {
        var body = table.tBodies[0], rows = Array.from(body.rows), desc = th.dataset.desc !== "1";
        th.dataset.desc = desc ? "1" : "0";
        var key = function (tr) { var c = tr.cells[col]; return c.dataset.v !== undefined && c.dataset.v !== "" ? parseFloat(c.dataset.v) : c.textContent; };
        rows.sort(function (a, b) { var x = key(a), y = key(b); var r = x < y ? -1 : x > y ? 1 : 0; return desc ? -r : r; });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
})();
