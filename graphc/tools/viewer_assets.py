"""The styles and scripts of the graph viewer's page (graphc.tools.viewer), inline in the page.

`CORE_JS` is the part without a DOM: the view model's tree, what is visible with the current
collapsed groups, the layered layout (a port of graphc.ir.export.layered_layout and its box
packing) and the search. It defines `graphcCore(data, measure)` and, under node, exports it,
so tests run it with node alone. `UI_JS` draws the SVG, and handles zoom, pan, search,
collapse and the side panel; it exposes `window.graphcViewer`.
"""

PAGE_CSS = """
html, body { margin: 0; height: 100%; font-family: Helvetica, Arial, sans-serif; }
body { display: flex; flex-direction: column; }
#toolbar { display: flex; gap: 6px; align-items: center; padding: 6px 10px;
  border-bottom: 1px solid #ccc; background: #fafafa; font-size: 13px; flex-wrap: wrap; }
#toolbar .hint { color: #888; font-size: 11px; margin-left: auto; }
#count { min-width: 5em; color: #555; }
main { flex: 1; display: flex; min-height: 0; }
#canvas { flex: 1; cursor: grab; background: white; user-select: none; }
#canvas.panning { cursor: grabbing; }
#panel { width: 320px; border-left: 1px solid #ccc; overflow: auto; font-size: 12px;
  padding: 0 8px; background: #fcfcfc; }
#panel h3 { font-size: 12px; margin: 10px 0 4px; color: #444; }
#details { white-space: pre-wrap; word-break: break-all; font-size: 11px; margin: 0; }
#groups, #groups ul { list-style: none; padding-left: 12px; margin: 0; }
#groups li { margin: 1px 0; }
#groups .toggle { cursor: pointer; font-family: monospace; color: #333; }
#groups .toggle:hover { text-decoration: underline; }
.node { cursor: pointer; }
.node rect.box { stroke-width: 1; }
.node text { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px;
  fill: #444; text-rendering: geometricPrecision; }
.node text tspan.head { font-weight: bold; fill: #222; }
.node.group rect.box { stroke-width: 2.2; stroke-dasharray: none; }
.node.kind-input rect.box, .node.kind-output rect.box, .node.kind-update rect.box { rx: 12; }
.node.kind-update rect.box { stroke-dasharray: 4 2; }
.node.match rect.box { stroke: #f9a825 !important; stroke-width: 3; }
.node.current rect.box { stroke: #d50000 !important; stroke-width: 4; }
.node.selected rect.box { filter: drop-shadow(0 0 4px #1e88e5); }
.edge path { fill: none; stroke: #777; stroke-width: 1; }
.edge.near path { stroke: #1e88e5; stroke-width: 2; }
.cluster rect { fill: none; stroke: #6a1b9a; stroke-dasharray: 5 3; stroke-width: 1; }
.cluster text { font-size: 11px; fill: #6a1b9a; cursor: pointer; font-family: monospace; }
.cluster.kind-region rect { stroke: #8d6e00; fill: rgba(255, 248, 200, 0.18); }
.cluster.kind-region text { fill: #8d6e00; }
.stripe { pointer-events: none; }
"""

CORE_JS = r"""
function graphcCore(data, measure) {
  'use strict';
  // measure(): {charW, lineH} of the label font; node passes fixed numbers.
  const PAD_X = 8, PAD_Y = 5, GAP_X = 18, GAP_Y = 34;
  const items = new Map();
  for (const n of data.nodes) items.set(n.id, Object.assign({isGroup: false}, n));
  for (const g of data.groups) items.set(g.id, Object.assign({isGroup: true}, g));
  const collapsed = new Set(data.groups.filter(g => g.collapsed).map(g => g.id));
  const children = new Map(data.groups.map(g => [g.id, []]));
  for (const it of items.values()) if (it.parent) children.get(it.parent).push(it.id);

  function ancestors(id) {  // nearest first
    const out = [];
    for (let p = items.get(id).parent; p; p = items.get(p).parent) out.push(p);
    return out;
  }
  function shownAs(id) {  // the outermost collapsed group around id, else id itself
    let rep = id;
    for (const a of ancestors(id)) if (collapsed.has(a)) rep = a;
    return rep;
  }
  function visibleGraph() {
    const ids = [], seen = new Set(), byPair = new Map();
    for (const n of data.nodes) {
      const r = shownAs(n.id);
      if (!seen.has(r)) { seen.add(r); ids.push(r); }
    }
    for (const e of data.edges) {
      const u = shownAs(e.src), v = shownAs(e.dst);
      if (u === v) continue;
      const key = u + '\u0000' + v;
      if (!byPair.has(key)) byPair.set(key, {src: u, dst: v, values: []});
      const values = byPair.get(key).values;
      if (!values.includes(e.value)) values.push(e.value);
    }
    return {ids, edges: [...byPair.values()]};
  }
  function boxSize(id) {
    const it = items.get(id), m = measure();
    // a group's first line starts with its two-character collapse mark
    const chars = Math.max(1, ...it.lines.map((s, i) => s.length + (it.isGroup && !i ? 2 : 0)));
    const lines = it.lines;
    return {w: chars * m.charW + 2 * PAD_X, h: lines.length * m.lineH + 2 * PAD_Y};
  }
  function pack(row, desired, weight, box) {
    // centres in order, boxes apart, least weighted squared distance to desired
    // (pool adjacent violators, as graphc.ir.export._pack)
    const offsets = [0];
    for (let k = 1; k < row.length; k++)
      offsets.push(offsets[k - 1] + (box.get(row[k - 1]).w + box.get(row[k]).w) / 2 + GAP_X);
    const blocks = [];
    for (let k = 0; k < row.length; k++) {
      blocks.push([desired[k] - offsets[k], weight[k], 1]);
      while (blocks.length > 1 && blocks[blocks.length - 2][0] > blocks[blocks.length - 1][0]) {
        const b1 = blocks.pop(), b2 = blocks.pop();
        blocks.push([(b1[0] * b1[1] + b2[0] * b2[1]) / (b1[1] + b2[1]), b1[1] + b2[1],
                     b1[2] + b2[2]]);
      }
    }
    let i = 0;
    for (const [mean, , count] of blocks)
      for (let j = 0; j < count; j++, i++) box.get(row[i]).x = mean + offsets[i];
  }
  function layout(vis) {
    const ids = vis.ids;
    const succ = new Map(ids.map(i => [i, []])), pred = new Map(ids.map(i => [i, []]));
    for (const e of vis.edges) { succ.get(e.src).push(e.dst); pred.get(e.dst).push(e.src); }
    // topological generations; a cycle (collapsed groups may make one) is broken in order
    const indeg = new Map(ids.map(i => [i, pred.get(i).length]));
    const layer = new Map(), topo = [];
    let frontier = ids.filter(i => indeg.get(i) === 0), gen = 0;
    while (topo.length < ids.length) {
      if (!frontier.length) frontier = [ids.find(i => !layer.has(i))];
      const next = [];
      for (const n of frontier) {
        if (layer.has(n)) continue;
        layer.set(n, gen); topo.push(n);
        for (const s of succ.get(n)) {
          indeg.set(s, indeg.get(s) - 1);
          if (indeg.get(s) === 0 && !layer.has(s)) next.push(s);
        }
      }
      frontier = next; gen++;
    }
    for (const n of topo.slice().reverse()) {  // next to the nearest user
      const below = succ.get(n).map(s => layer.get(s)).filter(l => l > layer.get(n));
      if (below.length && below.length === succ.get(n).length)
        layer.set(n, Math.min(...below) - 1);
    }
    const depth = Math.max(-1, ...ids.map(i => layer.get(i))) + 1;
    const layers = Array.from({length: depth}, () => []);
    for (const n of ids) layers[layer.get(n)].push(n);
    for (let sweep = 0; sweep < 8; sweep++) {  // barycenter ordering
      const down = sweep % 2 === 0;
      const pos = new Map();
      for (const row of layers) row.forEach((n, i) => pos.set(n, i));
      const rows = down ? layers.slice(1) : layers.slice(0, -1).reverse();
      for (const row of rows) {
        const key = new Map();
        row.forEach((n, i) => {
          const near = down ? pred.get(n) : succ.get(n);
          key.set(n, near.length ? near.reduce((a, m) => a + pos.get(m), 0) / near.length : i);
        });
        row.sort((a, b) => key.get(a) - key.get(b));
        row.forEach((n, i) => pos.set(n, i));
      }
    }
    const box = new Map(ids.map(i => [i, Object.assign({x: 0, y: 0}, boxSize(i))]));
    let y = 0;
    for (const row of layers) {
      const h = Math.max(0, ...row.map(n => box.get(n).h));
      for (const n of row) box.get(n).y = y + (h - box.get(n).h) / 2;
      y += h + GAP_Y;
    }
    for (const row of layers) pack(row, row.map(() => 0), row.map(() => 1), box);
    for (let sweep = 0; sweep < 8; sweep++) {
      const down = sweep % 2 === 0;
      for (const row of down ? layers : layers.slice().reverse()) {
        const desired = [], weight = [];
        for (const n of row) {
          let near = down ? pred.get(n) : succ.get(n);
          if (!near.length) near = down ? succ.get(n) : pred.get(n);
          desired.push(near.length ?
            near.reduce((a, m) => a + box.get(m).x, 0) / near.length : box.get(n).x);
          weight.push(1 + near.length);
        }
        pack(row, desired, weight, box);
      }
    }
    return {box, layers};
  }
  function search(query) {
    const q = query.trim().toLowerCase();
    if (!q) return [];
    if (q.startsWith('%')) {  // a value: the leaf that defines it, else substring matches
      const exact = data.nodes.filter(n => n.defines.some(d => '%' + d.toLowerCase() === q));
      if (exact.length) return exact.map(n => n.id);
    }
    // groups (a fused node's label) and leaves, in graph order; a leaf inside a group that
    // matches is not listed again
    const hit = new Set();
    for (const it of items.values()) if (it.find && it.find.includes(q)) hit.add(it.id);
    const order = [];
    for (const n of data.nodes) {
      const outer = ancestors(n.id).reverse().find(a => hit.has(a));
      const id = outer || (hit.has(n.id) ? n.id : null);
      if (id && !order.includes(id)) order.push(id);
    }
    return order;
  }
  function reveal(id) {  // expand every group around id; true when something changed
    let changed = false;
    for (const a of ancestors(id)) if (collapsed.delete(a)) changed = true;
    return changed;
  }
  return {items, collapsed, children, ancestors, shownAs, visibleGraph, layout, search, reveal,
          boxSize, PAD_X, PAD_Y};
}
if (typeof module !== 'undefined') module.exports = {graphcCore};
"""

UI_JS = r"""
(function () {
  'use strict';
  const SVG = 'http://www.w3.org/2000/svg';
  const data = JSON.parse(document.getElementById('graphc-data').textContent);
  let metrics = null;
  function measure() {
    if (metrics) return metrics;
    const probe = document.createElementNS(SVG, 'text');
    probe.setAttribute('class', 'probe');
    probe.textContent = 'M'.repeat(40);
    const g = document.createElementNS(SVG, 'g');
    g.setAttribute('class', 'node');
    g.appendChild(probe);
    document.getElementById('nodes').appendChild(g);
    const bb = probe.getBBox();
    g.remove();
    metrics = {charW: bb.width / 40 * 1.02 + 0.1, lineH: Math.max(bb.height, 12) * 1.12};
    return metrics;
  }
  const core = graphcCore(data, measure);
  const svg = document.getElementById('canvas');
  const viewport = document.getElementById('viewport');
  const view = {x: 20, y: 20, k: 1};
  let placed = null, matches = [], current = -1, selected = null;
  const regionIds = data.groups.filter(g => g.kind === 'region').map(g => g.id);
  const regionColor = new Map(regionIds.map((id, i) =>
    [id, data.regionColors[i % data.regionColors.length]]));

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }
  function applyView() {
    viewport.setAttribute('transform', `translate(${view.x},${view.y}) scale(${view.k})`);
  }
  function regionOf(id) {
    return core.ancestors(id).find(a => core.items.get(a).kind === 'region');
  }

  function draw() {
    const vis = core.visibleGraph();
    placed = core.layout(vis);
    const nodesG = document.getElementById('nodes'), edgesG = document.getElementById('edges');
    const clustersG = document.getElementById('clusters');
    nodesG.textContent = ''; edgesG.textContent = ''; clustersG.textContent = '';
    const m = measure();
    for (const id of vis.ids) {
      const it = core.items.get(id), b = placed.box.get(id);
      const isGroup = it.isGroup;
      const g = el('g', {class: `node kind-${it.kind}` + (isGroup ? ' group collapsed' : ''),
                         'data-id': id, transform: `translate(${b.x - b.w / 2},${b.y})`},
                   nodesG);
      el('rect', {class: 'box', width: b.w, height: b.h, rx: 4}, g);
      const region = regionOf(id);
      if (region && !isGroup)
        el('rect', {class: 'stripe', width: 4, height: b.h, rx: 2,
                    fill: regionColor.get(region)}, g);
      const text = el('text', {}, g);
      it.lines.forEach((line, i) => {
        const t = el('tspan', {x: b.w / 2, y: core.PAD_Y + (i + 0.78) * m.lineH,
                               'text-anchor': 'middle', class: i === 0 ? 'head' : ''}, text);
        t.textContent = (isGroup && i === 0 ? '\u229e ' : '') + line;
      });
      const tip = el('title', {}, g);
      tip.textContent = it.text +  // an IR line ends with its source line
        (isGroup ? `\n(${it.size} nodes; click to expand)` : '');
      g.addEventListener('click', ev => { ev.stopPropagation(); select(id); });
      if (isGroup) g.addEventListener('click', () => toggle(id));
    }
    for (const e of vis.edges) {
      const a = placed.box.get(e.src), b = placed.box.get(e.dst);
      const x1 = a.x, y1 = a.y + a.h, x2 = b.x, y2 = b.y;
      const dy = Math.max(12, Math.abs(y2 - y1) / 2);
      const g = el('g', {class: 'edge', 'data-src': e.src, 'data-dst': e.dst}, edgesG);
      el('path', {d: `M${x1},${y1} C${x1},${y1 + dy} ${x2},${y2 - dy} ${x2},${y2}`,
                  'marker-end': 'url(#arrow)'}, g);
      const tip = el('title', {}, g);
      tip.textContent = e.values.map(v => '%' + v).join(', ');
    }
    // expanded groups: a dashed frame around what they show, the title collapses them
    for (const grp of data.groups) {  // regions, io: the colour stripe and the group tree
      if (!['fused', 'group'].includes(grp.kind) || core.collapsed.has(grp.id) ||
          core.ancestors(grp.id).some(a => core.collapsed.has(a)))
        continue;
      const inside = vis.ids.filter(id => id === grp.id ||
                                     core.ancestors(id).includes(grp.id));
      if (!inside.length) continue;
      const bs = inside.map(id => placed.box.get(id));
      const x0 = Math.min(...bs.map(b => b.x - b.w / 2)) - 6;
      const x1 = Math.max(...bs.map(b => b.x + b.w / 2)) + 6;
      const y0 = Math.min(...bs.map(b => b.y)) - 16, y1 = Math.max(...bs.map(b => b.y + b.h)) + 6;
      const g = el('g', {class: `cluster kind-${grp.kind}`, 'data-id': grp.id}, clustersG);
      const frame = el('rect', {x: x0, y: y0, width: x1 - x0, height: y1 - y0, rx: 6}, g);
      const t = el('text', {x: x0 + 4, y: y0 + 11}, g);
      t.textContent = '\u229f ' + grp.lines[0];
      const tip = el('title', {}, t);
      tip.textContent = grp.text + '\n(click to collapse)';
      t.addEventListener('click', ev => { ev.stopPropagation(); toggle(grp.id); });
    }
    markMatches();
    drawGroupTree();
  }

  function markMatches() {
    const shown = new Set(matches.map(id => core.shownAs(id)));
    const cur = current >= 0 ? core.shownAs(matches[current]) : null;
    for (const g of document.querySelectorAll('#nodes .node')) {
      const id = g.getAttribute('data-id');
      g.classList.toggle('match', shown.has(id));
      g.classList.toggle('current', id === cur);
      g.classList.toggle('selected', id === selected);
    }
    for (const e of document.querySelectorAll('#edges .edge'))
      e.classList.toggle('near', selected !== null &&
        (e.getAttribute('data-src') === selected || e.getAttribute('data-dst') === selected));
    document.getElementById('count').textContent =
      matches.length ? `${current + 1} of ${matches.length}` :
      (document.getElementById('search').value.trim() ? 'no match' : '');
  }

  function drawGroupTree() {
    const root = document.getElementById('groups');
    root.textContent = '';
    function add(id, parentEl) {
      const grp = core.items.get(id);
      const li = document.createElement('li');
      const span = document.createElement('span');
      span.className = 'toggle';
      span.setAttribute('data-id', id);
      span.textContent = (core.collapsed.has(id) ? '\u229e ' : '\u229f ') +
        (grp.kind === 'fused' ? id + ' ' : '') + grp.lines[0] + ` (${grp.size})`;
      if (grp.kind === 'region') span.style.color = regionColor.get(id);
      span.addEventListener('click', () => toggle(id));
      li.appendChild(span);
      const sub = core.children.get(id).filter(c => core.items.get(c).isGroup);
      if (sub.length && !core.collapsed.has(id)) {
        const ul = document.createElement('ul');
        for (const c of sub) add(c, ul);
        li.appendChild(ul);
      }
      parentEl.appendChild(li);
    }
    for (const grp of data.groups) if (!grp.parent) add(grp.id, root);
  }

  function select(id) {
    selected = id;
    const it = core.items.get(id);
    document.getElementById('details').textContent =
      `${id}\n${it.text}` +
      (it.isGroup ? `\n${it.size} nodes inside` : '');
    markMatches();
  }
  function toggle(id) {
    if (core.collapsed.has(id)) core.collapsed.delete(id); else core.collapsed.add(id);
    draw();
  }
  function setAll(collapse) {
    core.collapsed.clear();
    if (collapse) for (const grp of data.groups) core.collapsed.add(grp.id);
    draw();
  }
  function centre(id) {
    let b = placed.box.get(core.shownAs(id));
    if (!b) {  // an expanded group: its first box
      const inside = [...placed.box.keys()].find(k => core.ancestors(k).includes(id));
      b = inside && placed.box.get(inside);
    }
    if (!b) return;
    const r = svg.getBoundingClientRect();
    view.k = Math.max(view.k, 1);
    view.x = r.width / 2 - b.x * view.k;
    view.y = r.height / 2 - (b.y + b.h / 2) * view.k;
    applyView();
  }
  function fit() {
    const r = svg.getBoundingClientRect();
    let w = 0, h = 0, left = Infinity;
    for (const b of placed.box.values()) {
      left = Math.min(left, b.x - b.w / 2);
      w = Math.max(w, b.x + b.w / 2); h = Math.max(h, b.y + b.h);
    }
    if (!isFinite(left)) return;
    w -= left;
    view.k = Math.min(1.5, (r.width - 40) / Math.max(w, 1), (r.height - 40) / Math.max(h, 1));
    view.k = Math.max(view.k, 0.02);
    view.x = (r.width - w * view.k) / 2 - left * view.k;
    view.y = 20;
    applyView();
  }
  function find(query) {
    matches = core.search(query);
    current = matches.length ? 0 : -1;
    show();
    return matches.slice();
  }
  function show() {
    if (current >= 0) {
      const id = matches[current];
      if (core.reveal(id)) draw(); else markMatches();
      centre(id);
      select(core.shownAs(id));
    } else markMatches();
  }
  function step(by) {
    if (!matches.length) return;
    current = (current + by + matches.length) % matches.length;
    show();
  }

  const input = document.getElementById('search');
  input.addEventListener('keydown', ev => {
    if (ev.key === 'Enter') {
      if (input.dataset.last === input.value && matches.length) step(ev.shiftKey ? -1 : 1);
      else { input.dataset.last = input.value; find(input.value); }
    }
  });
  window.addEventListener('keydown', ev => {  // "/" searches, Escape clears the search
    if (ev.key === '/' && document.activeElement !== input) { ev.preventDefault(); input.focus(); }
    if (ev.key === 'Escape') { input.value = ''; input.dataset.last = ''; find(''); }
  });
  document.getElementById('next').addEventListener('click', () => step(1));
  document.getElementById('prev').addEventListener('click', () => step(-1));
  document.getElementById('fit').addEventListener('click', fit);
  document.getElementById('expand-all').addEventListener('click', () => setAll(false));
  document.getElementById('collapse-all').addEventListener('click', () => setAll(true));

  svg.addEventListener('wheel', ev => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    const px = ev.clientX - r.left, py = ev.clientY - r.top;
    const k = Math.min(8, Math.max(0.02, view.k * Math.exp(-ev.deltaY * 0.0015)));
    view.x = px - (px - view.x) * k / view.k;
    view.y = py - (py - view.y) * k / view.k;
    view.k = k;
    applyView();
  }, {passive: false});
  let drag = null;
  svg.addEventListener('pointerdown', ev => {
    drag = {x: ev.clientX - view.x, y: ev.clientY - view.y};
    svg.classList.add('panning');
  });
  window.addEventListener('pointermove', ev => {
    if (!drag) return;
    view.x = ev.clientX - drag.x; view.y = ev.clientY - drag.y;
    applyView();
  });
  window.addEventListener('pointerup', () => { drag = null; svg.classList.remove('panning'); });

  draw();
  fit();
  window.graphcViewer = {
    find, next: () => step(1), previous: () => step(-1), toggle, fit, centre,
    expandAll: () => setAll(false), collapseAll: () => setAll(true),
    collapsed: () => [...core.collapsed], view: () => Object.assign({}, view),
    visible: () => core.visibleGraph().ids, layout: () => placed,
  };
})();
"""
