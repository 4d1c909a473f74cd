// The timeline page's script (inlined into timeline.html by `simpler trace view`).
// It reads the embedded trace (#trace-data, written by src/diag/timeline_html.cpp:
// times in µs from the first task's start, tasks and other slices sorted by
// lane then start), draws one canvas row per lane under its process, and
// reports what it drew on #timeline-status for tests (data-lanes, data-tasks,
// data-drawn-tasks, data-selected, data-highlighted, data-error).
(function () {
  'use strict';

  const data = JSON.parse(document.getElementById('trace-data').textContent);
  const canvas = document.getElementById('timeline');
  const ctx = canvas.getContext('2d');
  const card = document.getElementById('card');
  const status = document.getElementById('timeline-status');
  const errorBox = document.getElementById('error');

  const kGutter = 120;    // px of lane labels
  const kAxis = 24;       // px of the time axis
  const kRow = 18;        // px per lane
  const kHeader = 20;     // px per process header
  const kMaxArrows = 2000;  // dependency edges in view drawn for one selection

  const T = data.tasks;
  const S = data.slices;
  const nTasks = T.ts.length;
  const nSlices = S.ts.length;

  // ---- the model: contiguous ranges per lane, rows, and lookups ----------

  // [begin, end) of each lane's entries in a (lane, ts)-sorted column.
  function laneRanges(laneColumn, count) {
    const begin = new Int32Array(data.lanes.length).fill(0);
    const end = new Int32Array(data.lanes.length).fill(0);
    for (let i = 0; i < count; ) {
      const l = laneColumn[i];
      let j = i;
      while (j < count && laneColumn[j] === l) j++;
      begin[l] = i;
      end[l] = j;
      i = j;
    }
    return { begin, end };
  }
  // The longest entry of each lane: a visible range starts that far before the view.
  function laneMaxDur(laneColumn, dur, count) {
    const m = new Float64Array(data.lanes.length);
    for (let i = 0; i < count; i++) m[laneColumn[i]] = Math.max(m[laneColumn[i]], dur[i]);
    return m;
  }
  const taskRange = laneRanges(T.lane, nTasks);
  const sliceRange = laneRanges(S.lane, nSlices);
  const taskMaxDur = laneMaxDur(T.lane, T.dur, nTasks);
  const sliceMaxDur = laneMaxDur(S.lane, S.dur, nSlices);

  // Rows, top to bottom: each process's header, then its lanes.
  const rows = [];
  const laneRow = new Int32Array(data.lanes.length);
  {
    let y = 0;
    data.processes.forEach(function (p, pi) {
      rows.push({ kind: 'process', process: pi, y: y, h: kHeader });
      y += kHeader;
      data.lanes.forEach(function (lane, li) {
        if (lane.process !== pi) return;
        laneRow[li] = rows.length;
        rows.push({ kind: 'lane', lane: li, y: y, h: kRow });
        y += kRow;
      });
    });
  }
  const contentHeight = rows.length ? rows[rows.length - 1].y + rows[rows.length - 1].h : 0;
  const laneRowCount = rows.filter(function (r) { return r.kind === 'lane'; }).length;

  function pidOf(i) { return data.processes[data.lanes[T.lane[i]].process].pid; }
  function keyOf(i) { return pidOf(i) + ':' + T.run[i] + ':' + T.id[i]; }

  // The first index in [lo, hi) whose ts is >= t.
  function lowerBound(ts, lo, hi, t) {
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (ts[mid] < t) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  // ---- the dependency chain ----------------------------------------------

  // Every transitive predecessor of task i, and i: a mark per task slice
  // (all blocks of an SPMD task are slices with its id, and all are marked).
  function chainOf(i) {
    const mark = new Uint8Array(nTasks);
    const stack = [];
    for (let j = 0; j < nTasks; j++) {
      if (T.id[j] === T.id[i] && T.run[j] === T.run[i] && pidOf(j) === pidOf(i)) { mark[j] = 1; stack.push(j); }
    }
    while (stack.length) {
      const t = stack.pop();
      for (let k = T.pred_off[t]; k < T.pred_off[t + 1]; k++) {
        const p = T.preds[k];
        if (!mark[p]) { mark[p] = 1; stack.push(p); }
      }
    }
    return mark;
  }

  // Successors as CSR (off, idx), built on the first selection.
  let succCache = null;
  function successors() {
    if (succCache) return succCache;
    const off = new Int32Array(nTasks + 1);
    for (let k = 0; k < T.preds.length; k++) off[T.preds[k] + 1]++;
    for (let i = 0; i < nTasks; i++) off[i + 1] += off[i];
    const fill = off.slice(0, nTasks);
    const idx = new Int32Array(T.preds.length);
    for (let i = 0; i < nTasks; i++) {
      for (let k = T.pred_off[i]; k < T.pred_off[i + 1]; k++) idx[fill[T.preds[k]]++] = i;
    }
    succCache = { off: off, idx: idx };
    return succCache;
  }

  let selected = -1;
  let chain = null;

  // A click on a task selects its chain; a click on the selected task, or
  // off any task (-1), clears the selection.
  function clickTask(i) { select(i >= 0 && i !== selected ? i : -1); }

  function select(i) {
    selected = i;
    chain = i >= 0 ? chainOf(i) : null;
    report();
    draw();
  }

  // ---- the view ------------------------------------------------------------

  const span = Math.max(data.span, 1e-3);
  let viewStart = -span * 0.01;
  let viewEnd = span * 1.01;
  let scrollY = 0;
  let width = 0;
  let height = 0;
  let drawnTasks = 0;

  function resize() {
    const dpr = window.devicePixelRatio || 1;
    width = Math.max(window.innerWidth, kGutter + 100);
    height = Math.max(window.innerHeight - canvas.getBoundingClientRect().top, 100);
    canvas.width = Math.floor(width * dpr);
    canvas.height = Math.floor(height * dpr);
    canvas.style.width = width + 'px';
    canvas.style.height = height + 'px';
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }

  function xOf(t) { return kGutter + (t - viewStart) * (width - kGutter) / (viewEnd - viewStart); }
  function tOf(x) { return viewStart + (x - kGutter) * (viewEnd - viewStart) / (width - kGutter); }

  const colorCache = new Map();
  function colorOf(name) {
    let c = colorCache.get(name);
    if (c) return c;
    let h = 2166136261;
    const s = data.names[name];
    for (let k = 0; k < s.length; k++) h = Math.imul(h ^ s.charCodeAt(k), 16777619);
    c = 'hsl(' + ((h >>> 0) % 360) + ',55%,55%)';
    colorCache.set(name, c);
    return c;
  }

  function formatTime(us) {
    const a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(3) + ' s';
    if (a >= 1e3) return (us / 1e3).toFixed(3) + ' ms';
    return us.toFixed(3) + ' us';
  }

  function drawAxis() {
    ctx.fillStyle = '#eceff1';
    ctx.fillRect(0, 0, width, kAxis);
    const perPx = (viewEnd - viewStart) / (width - kGutter);
    const raw = perPx * 100;
    const pow = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(function (m) { return m * pow; }).find(function (s) { return s >= raw; });
    if (!(step > 0)) return;
    ctx.fillStyle = '#37474f';
    ctx.strokeStyle = '#cfd8dc';
    ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'middle';
    for (let t = Math.ceil(viewStart / step) * step; t <= viewEnd; t += step) {
      const x = xOf(t);
      if (x < kGutter) continue;
      ctx.beginPath();
      ctx.moveTo(x + 0.5, kAxis - 6);
      ctx.lineTo(x + 0.5, height);
      ctx.stroke();
      ctx.fillText(formatTime(t), x + 3, kAxis / 2);
    }
  }

  // Draws entries [lo, hi) of one lane that meet the view, and returns how
  // many met it. An entry narrower than a pixel joins a run of its
  // neighbours that is filled once, so a frame costs at most one fill per
  // pixel column plus one per wide entry. `only` (a mark per entry, or null)
  // picks the entries drawn: `want` 1 draws the marked ones, 0 the others.
  function drawEntries(ts, dur, names, lo, hi, maxDur, y, h, only, want) {
    const first = lowerBound(ts, lo, hi, viewStart - maxDur);
    let runX0 = 0, runX1 = -1, runName = -1;
    const left = kGutter;
    const minWidth = only !== null && want === 1 ? 2 : 1;  // a chain's short task stays visible
    function flush() {
      if (runX1 < runX0) return;
      ctx.fillStyle = runName >= 0 ? colorOf(runName) : '#90a4ae';
      ctx.fillRect(runX0, y, Math.max(runX1 - runX0, minWidth), h);
      runX1 = -1;
    }
    let counted = 0;
    for (let i = first; i < hi && ts[i] <= viewEnd; i++) {
      const end = ts[i] + dur[i];
      if (end < viewStart) continue;
      counted++;
      if (only !== null && only[i] !== want) continue;
      const x0 = Math.max(xOf(ts[i]), left);
      const x1 = xOf(end);
      if (x1 - x0 < 1) {
        if (runX1 >= runX0 && x0 <= runX1 + 1) {
          runX1 = Math.max(runX1, x1);
          if (runName !== names[i]) runName = -1;
        } else {
          flush();
          runX0 = Math.floor(x0);
          runX1 = Math.max(x1, runX0 + 1);
          runName = names[i];
        }
        continue;
      }
      flush();
      ctx.fillStyle = colorOf(names[i]);
      ctx.fillRect(x0, y, Math.max(x1 - x0, minWidth), h);
      if (only !== null && want === 1 && x1 - x0 >= 4) {
        ctx.strokeStyle = '#263238';
        ctx.lineWidth = 1;
        ctx.strokeRect(x0 + 0.5, y + 0.5, x1 - x0 - 1, h - 1);
      }
      if (x1 - x0 > 40) {
        ctx.save();
        ctx.beginPath();
        ctx.rect(x0, y, x1 - x0, h);
        ctx.clip();
        ctx.fillStyle = '#fff';
        ctx.fillText(data.names[names[i]], x0 + 3, y + h / 2);
        ctx.restore();
      }
    }
    flush();
    return counted;
  }

  // An arrow per dependency edge of the selected chain with an end in view,
  // when there are at most kMaxArrows of them (more is a solid smear that
  // costs more than the rest of the frame), and the selected task's outline.
  function drawChainEdges() {
    if (chain === null) return;
    // The chain's edges into and out of the tasks in view: each lane's
    // visible range, its tasks' predecessors and successors (an edge with both
    // ends in view is met twice and kept once).
    const succ = successors();
    const edges = [];
    for (let l = 0; l < data.lanes.length && edges.length <= 2 * kMaxArrows; l++) {
      const end = taskRange.end[l];
      for (let i = lowerBound(T.ts, taskRange.begin[l], end, viewStart - taskMaxDur[l]);
        i < end && T.ts[i] <= viewEnd; i++) {
        if (!chain[i] || T.ts[i] + T.dur[i] < viewStart) continue;
        for (let k = T.pred_off[i]; k < T.pred_off[i + 1]; k++) edges.push(T.preds[k], i);
        for (let k = succ.off[i]; k < succ.off[i + 1]; k++) {
          const c = succ.idx[k];
          const cInView = T.ts[c] <= viewEnd && T.ts[c] + T.dur[c] >= viewStart;
          if (chain[c] && !cInView) edges.push(i, c);
        }
      }
    }
    const draw = edges.length / 2 <= kMaxArrows;
    status.dataset.arrows = draw ? String(edges.length / 2) : 'too many';
    if (draw) {
      ctx.strokeStyle = 'rgba(213,0,0,0.7)';
      ctx.lineWidth = 1;
      ctx.beginPath();
      for (let e = 0; e < edges.length; e += 2) {
        const p = edges[e], i = edges[e + 1];
        const yp = rows[laneRow[T.lane[p]]].y - scrollY + kAxis + kRow / 2;
        const yc = rows[laneRow[T.lane[i]]].y - scrollY + kAxis + kRow / 2;
        ctx.moveTo(Math.max(xOf(T.ts[p] + T.dur[p]), kGutter), yp);
        ctx.lineTo(Math.max(xOf(T.ts[i]), kGutter), yc);
      }
      ctx.stroke();
    }
    const r = rows[laneRow[T.lane[selected]]];
    const x0 = Math.max(xOf(T.ts[selected]), kGutter);
    const x1 = Math.max(xOf(T.ts[selected] + T.dur[selected]), x0 + 2);
    ctx.strokeStyle = '#d50000';
    ctx.lineWidth = 2;
    ctx.strokeRect(x0 - 1, r.y - scrollY + kAxis + 1, x1 - x0 + 2, kRow - 2);
  }

  function draw() {
    const started = performance.now();
    ctx.clearRect(0, 0, width, height);
    ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'middle';
    drawAxis();
    drawnTasks = 0;
    for (const r of rows) {
      const y = r.y - scrollY + kAxis;
      if (y + r.h < kAxis || y > height) continue;
      if (r.kind === 'process') {
        ctx.fillStyle = '#cfd8dc';
        ctx.fillRect(0, y, width, r.h);
        ctx.fillStyle = '#263238';
        ctx.font = 'bold 11px system-ui, sans-serif';
        ctx.fillText(data.processes[r.process].name + '  (pid ' + data.processes[r.process].pid + ')', 6, y + r.h / 2);
        ctx.font = '11px system-ui, sans-serif';
        continue;
      }
      const l = r.lane;
      ctx.save();
      ctx.beginPath();
      ctx.rect(kGutter, y, width - kGutter, r.h);
      ctx.clip();
      ctx.globalAlpha = chain !== null ? 0.25 : 1;
      drawEntries(S.ts, S.dur, S.name, sliceRange.begin[l], sliceRange.end[l], sliceMaxDur[l], y + 4, r.h - 8, null, 0);
      drawnTasks += drawEntries(T.ts, T.dur, T.name, taskRange.begin[l], taskRange.end[l], taskMaxDur[l], y + 2,
                                r.h - 4, chain, 0);
      ctx.globalAlpha = 1;
      if (chain !== null) {
        drawEntries(T.ts, T.dur, T.name, taskRange.begin[l], taskRange.end[l], taskMaxDur[l], y + 2, r.h - 4, chain, 1);
      }
      ctx.restore();
      ctx.fillStyle = '#eceff1';
      ctx.fillRect(0, y, kGutter, r.h);
      ctx.fillStyle = '#37474f';
      ctx.fillText(data.lanes[l].name, 10, y + r.h / 2);
    }
    ctx.save();
    ctx.beginPath();
    ctx.rect(kGutter, kAxis, width - kGutter, height - kAxis);
    ctx.clip();
    drawChainEdges();
    ctx.restore();
    status.dataset.drawnTasks = String(drawnTasks);
    status.dataset.renderMs = (performance.now() - started).toFixed(2);
  }

  // ---- what the page reports (tests read it through --dump-dom) ----------

  function report() {
    status.dataset.processes = String(data.processes.length);
    status.dataset.lanes = String(laneRowCount);
    status.dataset.tasks = String(nTasks);
    status.dataset.selected = selected >= 0 ? keyOf(selected) : '';
    const keys = [];
    if (chain !== null) {
      for (let i = 0; i < nTasks; i++) if (chain[i]) keys.push([pidOf(i), T.run[i], T.id[i]]);
      keys.sort(function (a, b) { return a[0] - b[0] || a[1] - b[1] || a[2] - b[2]; });
    }
    status.dataset.highlighted = keys.map(function (k) { return k.join(':'); }).join(' ');
    status.dataset.highlightedCount = String(keys.length);
  }

  function showError(message) {
    status.dataset.error = message;
    errorBox.textContent = message;
    errorBox.hidden = false;
  }

  // ---- hit testing, the hover card and the mouse ---------------------------

  // The task (or other slice) under (x, y), within 3 px for thin ones.
  function hit(x, y) {
    if (x < kGutter || y < kAxis) return null;
    const cy = y - kAxis + scrollY;
    const r = rows.find(function (row) { return cy >= row.y && cy < row.y + row.h; });
    if (!r || r.kind !== 'lane') return null;
    const t = tOf(x);
    const slack = 3 * (viewEnd - viewStart) / (width - kGutter);
    function nearest(ts, dur, lo, hi, maxDur) {
      let best = -1, bestGap = Infinity;
      const end = lowerBound(ts, lo, hi, t + slack + 1e-9);
      for (let i = lowerBound(ts, lo, hi, t - slack - maxDur); i < end; i++) {
        const gap = t < ts[i] ? ts[i] - t : t > ts[i] + dur[i] ? t - ts[i] - dur[i] : 0;
        if (gap <= slack && gap < bestGap) { best = i; bestGap = gap; }
      }
      return best;
    }
    const l = r.lane;
    const task = nearest(T.ts, T.dur, taskRange.begin[l], taskRange.end[l], taskMaxDur[l]);
    if (task >= 0) return { task: task };
    const slice = nearest(S.ts, S.dur, sliceRange.begin[l], sliceRange.end[l], sliceMaxDur[l]);
    return slice >= 0 ? { slice: slice } : null;
  }

  function cardText(h) {
    if (h.task !== undefined) {
      const i = h.task;
      // Each predecessor once, though an SPMD one has a slice per block.
      const all = [];
      for (let k = T.pred_off[i]; k < T.pred_off[i + 1]; k++) {
        if (all.indexOf(T.id[T.preds[k]]) < 0) all.push(T.id[T.preds[k]]);
      }
      const n = all.length;
      const preds = all.slice(0, 16);
      const lane = data.lanes[T.lane[i]];
      return data.names[T.name[i]] + '\n' +
        'task      ' + T.id[i] + '  (pid ' + pidOf(i) + ', run ' + T.run[i] + ')\n' +
        'lane      ' + data.processes[lane.process].name + ' / ' + lane.name + '\n' +
        'start     ' + formatTime(T.ts[i]) + '\n' +
        'duration  ' + formatTime(T.dur[i]) + '\n' +
        'preds     ' + (n ? preds.join(', ') + (n > preds.length ? ' (+' + (n - preds.length) + ' more)' : '') : 'none');
    }
    const i = h.slice;
    return data.names[S.name[i]] + '\n' + 'category  ' + data.cats[S.cat[i]] + '\n' +
      'start     ' + formatTime(S.ts[i]) + '\n' + 'duration  ' + formatTime(S.dur[i]);
  }

  function showCard(h, clientX, clientY) {
    if (!h) { card.hidden = true; return; }
    card.textContent = cardText(h);
    card.hidden = false;
    const x = Math.min(clientX + 14, window.innerWidth - card.offsetWidth - 4);
    const y = Math.min(clientY + 14, window.innerHeight - card.offsetHeight - 4);
    card.style.left = Math.max(x, 0) + 'px';
    card.style.top = Math.max(y, 0) + 'px';
  }

  let drag = null;
  let frame = 0;
  function redraw() {
    if (frame) return;
    frame = requestAnimationFrame(function () { frame = 0; draw(); });
  }
  function clampScroll() {
    scrollY = Math.min(Math.max(scrollY, 0), Math.max(contentHeight - (height - kAxis), 0));
  }

  canvas.addEventListener('wheel', function (e) {
    e.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const x = Math.max(e.clientX - rect.left, kGutter);
    const at = tOf(x);
    const factor = Math.exp(e.deltaY * 0.002);
    const newSpan = Math.min(Math.max((viewEnd - viewStart) * factor, 1e-3), span * 10);
    viewStart = at - (x - kGutter) / (width - kGutter) * newSpan;
    viewEnd = viewStart + newSpan;
    redraw();
  }, { passive: false });

  canvas.addEventListener('mousedown', function (e) {
    drag = { x: e.clientX, y: e.clientY, start: viewStart, end: viewEnd, scroll: scrollY, moved: false };
    canvas.classList.add('dragging');
  });
  window.addEventListener('mousemove', function (e) {
    const rect = canvas.getBoundingClientRect();
    if (drag) {
      const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
      const dt = dx * (drag.end - drag.start) / (width - kGutter);
      viewStart = drag.start - dt;
      viewEnd = drag.end - dt;
      scrollY = drag.scroll - dy;
      clampScroll();
      card.hidden = true;
      redraw();
      return;
    }
    showCard(hit(e.clientX - rect.left, e.clientY - rect.top), e.clientX, e.clientY);
  });
  window.addEventListener('mouseup', function (e) {
    if (!drag) return;
    const wasClick = !drag.moved;
    drag = null;
    canvas.classList.remove('dragging');
    if (!wasClick) return;
    const rect = canvas.getBoundingClientRect();
    const h = hit(e.clientX - rect.left, e.clientY - rect.top);
    clickTask(h && h.task !== undefined ? h.task : -1);
  });
  canvas.addEventListener('mouseleave', function () { card.hidden = true; });
  window.addEventListener('resize', function () { resize(); clampScroll(); draw(); });

  // ---- #select=TASK, #click=TASK,TASK,... (TASK or PID:RUN:TASK) ------------

  // The task a URL names, or -1 after reporting why there is none.
  function taskNamed(want, param) {
    const parts = want.split(':');
    if (parts.length !== 1 && parts.length !== 3) {
      showError('#' + param + '=' + want + ': expected TASK or PID:RUN:TASK');
      return -1;
    }
    const matches = [];
    for (let i = 0; i < nTasks; i++) {
      if (parts.length === 3 ? keyOf(i) === want : String(T.id[i]) === want) matches.push(i);
    }
    // The blocks of one SPMD task share its key: one task, however many slices.
    const keys = new Set(matches.map(keyOf));
    if (keys.size === 1) return matches[0];
    showError('#' + param + '=' + want + ': ' +
      (keys.size ? keys.size + ' tasks have that id; name one as PID:RUN:TASK' : 'no such task'));
    return -1;
  }

  // #select opens with a task's chain selected; #click replays clicks on
  // tasks in order, as the mouse would (a second click on one clears it).
  function applyHash() {
    const hash = window.location.hash;
    const sel = /(?:^#|&)select=([^&]*)/.exec(hash);
    const clicks = /(?:^#|&)click=([^&]*)/.exec(hash);
    status.dataset.error = '';
    errorBox.hidden = true;
    if (sel) {
      const i = taskNamed(decodeURIComponent(sel[1]), 'select');
      if (i >= 0) select(i);
    }
    if (clicks) {
      for (const want of decodeURIComponent(clicks[1]).split(',')) {
        const i = taskNamed(want, 'click');
        if (i < 0) break;
        clickTask(i);
      }
    }
    if (selected >= 0) {
      card.textContent = cardText({ task: selected });
      status.dataset.card = card.textContent;
    }
  }
  window.addEventListener('hashchange', applyHash);

  // #bench: frames at the full view and zoomed 10x and 1000x into the
  // middle, five each; data-bench-ms is the mean per frame at each zoom.
  function bench() {
    if (!/(?:^#|&)bench(?:&|$)/.test(window.location.hash)) return;
    const full = [viewStart, viewEnd];
    const means = [1, 10, 1000].map(function (zoom) {
      const mid = (full[0] + full[1]) / 2, half = (full[1] - full[0]) / 2 / zoom;
      viewStart = mid - half;
      viewEnd = mid + half;
      const started = performance.now();
      for (let k = 0; k < 5; k++) draw();
      return ((performance.now() - started) / 5).toFixed(2);
    });
    viewStart = full[0];
    viewEnd = full[1];
    draw();
    status.dataset.benchMs = means.join(' ');
  }

  document.getElementById('info').textContent = data.processes.length + ' processes, ' + laneRowCount +
    ' lanes, ' + nTasks + ' tasks, ' + formatTime(data.span);
  resize();
  status.dataset.error = '';
  report();
  draw();
  status.dataset.firstRenderMs = status.dataset.renderMs;
  applyHash();
  bench();
})();
