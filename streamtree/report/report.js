// The page script of a streamtree report. The geometry (band layouts, event marks,
// dendrogram segments) is computed in Python (streamtree/report/data.py); this script maps
// it to plotly traces, fills the tables and links the views (a click on a node shows its
// lineage). Text goes into the DOM through textContent only.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("report-data").textContent);
  const N = D.nodes, E = D.epochs, EV = D.events;
  const nEpochs = E.epoch.length;
  const CONFIG = { displaylogo: false, responsive: true };
  const FONT = { family: "system-ui, -apple-system, Segoe UI, Roboto, DejaVu Sans, sans-serif", size: 12 };
  const MARKS = {
    born: { name: "born", symbol: "triangle-right", color: "#1a7f37" },
    died: { name: "died", symbol: "x", color: "#cf222e" },
    split_from: { name: "split from", symbol: "triangle-left", color: "#8250df" },
    merged_into: { name: "merged into", symbol: "circle", color: "#bf8700" },
    // a merge into the root, whose band tops every column: a mark pointing up, no line across the view
    merged_into_root: { name: "merged into the root", symbol: "triangle-up", color: "#bf8700", event: "merged_into" },
    parent_changed: { name: "parent changed", symbol: "diamond", color: "#0969da" },
  };

  // ---- indexes -------------------------------------------------------------------------
  const rowsOfEpoch = Array.from({ length: nEpochs }, () => []);
  const rowsOfId = new Map();
  for (let i = 0; i < N.id.length; i++) {
    rowsOfEpoch[N.e[i]].push(i);
    if (!rowsOfId.has(N.id[i])) rowsOfId.set(N.id[i], []);
    rowsOfId.get(N.id[i]).push(i);
  }
  // relay chains (no documents of their own, one child): N.via maps a node row to the rows of
  // the relays above it, top first; the epoch view draws them with that node
  const relayRows = new Set();
  for (const r in N.via) for (const x of N.via[r]) relayRows.add(x);
  const eventsOfId = new Map(), eventsToId = new Map();
  for (let i = 0; i < EV.id.length; i++) {
    if (!eventsOfId.has(EV.id[i])) eventsOfId.set(EV.id[i], []);
    eventsOfId.get(EV.id[i]).push(i);
    if (EV.other[i] >= 0) {
      if (!eventsToId.has(EV.other[i])) eventsToId.set(EV.other[i], []);
      eventsToId.get(EV.other[i]).push(i);
    }
  }

  // ---- helpers -------------------------------------------------------------------------
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const pct = (x) => (100 * x).toFixed(x < 0.01 ? 2 : 1) + "%";
  const fmt = (n) => Number(n).toLocaleString("en");
  // a noun after a count, singular for exactly one (the rule of streamtree.wording.counted)
  const noun = (n, one, many) => (Number(n) === 1 ? one : many || one + "s");
  const count = (n, one, many) => fmt(n) + " " + noun(n, one, many);
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function nodeLink(id) {
    const a = el("a", String(id), "node");
    a.href = "#lineage-section";
    a.addEventListener("click", (ev) => { ev.preventDefault(); showLineage(id); });
    return a;
  }
  function row(cells, header) {
    const tr = el("tr");
    for (const c of cells) {
      const td = el(header ? "th" : "td");
      if (c instanceof Node) td.appendChild(c);
      else if (typeof c === "number") { td.textContent = fmt(c); td.className = "num"; }
      else td.textContent = c;
      tr.appendChild(td);
    }
    return tr;
  }
  function fillTable(table, head, rows) {
    table.replaceChildren(row(head, true), ...rows.map((r) => row(r)));
  }
  function epochAxis(n, labels, maxTicks) {
    const step = Math.max(1, Math.ceil(n / maxTicks));
    const vals = [], text = [];
    for (let i = 0; i < n; i += step) { vals.push(i); text.push(labels[i]); }
    return { tickvals: vals, ticktext: text, range: [-0.6, n - 0.4], zeroline: false, showgrid: false };
  }
  // a node's hover; ``via``: the ids of the relays drawn with it, top first
  function nodeHover(r, extra, via) {
    const head = via && via.length ? "<b>nodes " + via.concat([N.id[r]]).join(" › ") + "</b>"
      : "<b>node " + N.id[r] + "</b>";
    return head + " (" + esc(E.label[N.e[r]]) + ")" + (extra || "") +
      "<br>" + esc(N.words[r]) + "<br>parent " + N.parent[r] + ", depth " + N.depth[r] + ", mass " + N.mass[r] +
      (via && via.length ? "<br>" + via.join(", ") + ": no documents of their own and one child each, drawn with " +
        N.id[r] : "");
  }

  // ---- key figures ---------------------------------------------------------------------
  function keyFigures() {
    const S = D.summary;
    const items = [
      [S.n_epochs, "epoch"], [S.n_documents, "document"], [S.n_rejects, "rejected record"],
      [S.n_node_ids, "node id"], [S.n_node_epochs, "node over all epochs", "nodes over all epochs"],
      [S.vocabulary_size, "term"],
      [S.event_counts.born, "birth"], [S.event_counts.died, "death"],
      [S.event_counts.split_from, "split"], [S.event_counts.merged_into, "merge"],
      [S.event_counts.parent_changed, "parent change"],
    ].concat(S.relay_changes ? [[S.relay_changes, "relay change"]] : []);
    $("key-figures").replaceChildren(...items.map(([v, one, many]) => {
      const d = el("div", null, "figure");
      d.append(el("b", v === null ? "-" : fmt(v)), el("span", v === null ? noun(2, one, many) : noun(v, one, many)));
      return d;
    }));
  }

  // ---- the evolving tree ---------------------------------------------------------------
  const W = 0.3; // half width of a column
  function evolutionTraces(lay) {
    const ev = D.evolution, traces = [];
    const hx = [], hy = [], ht = [], hid = [];
    for (const b of lay.bands) {
      const x = [], y = [];
      let start = 0;
      for (let k = 0; k <= b.col.length; k++) {
        if (k === b.col.length || (k > start && b.col[k] !== b.col[k - 1] + 1)) {
          // close the polygon of the run start..k-1: top edge forward, bottom edge back
          for (let j = start; j < k; j++) { x.push(b.col[j] - W, b.col[j] + W); y.push(b.y0[j], b.y0[j]); }
          for (let j = k - 1; j >= start; j--) { x.push(b.col[j] + W, b.col[j] - W); y.push(b.y1[j], b.y1[j]); }
          x.push(null); y.push(null);
          start = k;
        }
      }
      let peak = 0;
      const relay = new Set(b.relay || []);
      for (let j = 0; j < b.col.length; j++) {
        if (b.docs[j] > b.docs[peak]) peak = j;
        if (relay.has(j)) continue; // hovered on the band of the node its chain leads to
        const docs = ev.column_documents[b.col[j]];
        hx.push(b.col[j]); hy.push((b.y0[j] + b.y1[j]) / 2); hid.push(b.id);
        const below = b.empty ? b.empty[j] : undefined; // no documents of its own, two or more children
        ht.push(nodeHover(b.row[j], below !== undefined
          ? "<br>no documents of its own (a thin band above its children); " + count(below, "document") +
            " below it, " + pct(docs ? below / docs : 0) + " of " + esc(ev.column_labels[b.col[j]])
          : "<br>" + count(b.docs[j], "document") + " in the band, " + pct(docs ? b.docs[j] / docs : 0) + " of " +
            esc(ev.column_labels[b.col[j]]), b.via && b.via[j]));
      }
      traces.push({
        type: "scatter", mode: "lines", x: x, y: y, fill: "toself", fillcolor: b.colour,
        line: { width: 0.4, color: "rgba(255,255,255,0.9)" }, hoveron: "fills", hoverinfo: "name",
        name: "node " + b.id + ": " + N.words[b.row[peak]].split(" ").slice(0, 4).join(" "),
        showlegend: false, meta: { kind: "band", node: b.id },
      });
    }
    traces.push({
      type: "scatter", mode: "markers", x: hx, y: hy, text: ht, customdata: hid, hovertemplate: "%{text}<extra></extra>",
      marker: { size: 7, opacity: 0 }, showlegend: false, name: "nodes", meta: { kind: "hover" },
    });
    for (const kind of Object.keys(MARKS)) {
      const m = lay.marks[kind];
      if (!m) continue;
      const spec = MARKS[kind];
      const lx = [], ly = [];
      for (let j = 0; j < m.x.length; j++) {
        if (m.x2[j] !== null) { lx.push(m.x2[j], m.x[j], null); ly.push(m.y2[j], m.y[j], null); }
      }
      if (lx.length) {
        traces.push({ type: "scatter", mode: "lines", x: lx, y: ly, hoverinfo: "skip", showlegend: false,
          line: { color: spec.color, width: 1.2, dash: "dot" }, meta: { kind: "event-line", event: kind } });
      }
      traces.push({
        type: "scatter", mode: "markers", name: spec.name, x: m.x, y: m.y,
        customdata: m.i.map((is) => EV.id[is[0]]),
        text: m.i.map((is) => is.map((i) => "node " + EV.id[i] + " " + spec.name +
          (EV.other[i] >= 0 ? (spec.event ? " (node " + EV.other[i] + ")" : " " + EV.other[i]) : "") +
          " (" + esc(E.label[EV.e[i]]) + ")").join("<br>")),
        hovertemplate: "%{text}<extra></extra>",
        marker: { symbol: spec.symbol, color: spec.color, size: 7, line: { width: 0.5, color: "white" } },
        meta: { kind: "event", event: kind },
      });
    }
    return traces;
  }
  function drawEvolution(index) {
    const ev = D.evolution, lay = ev.layouts[index];
    const layout = {
      font: FONT, margin: { l: 50, r: 20, t: 10, b: 70 }, hovermode: "closest", dragmode: "zoom",
      xaxis: Object.assign(epochAxis(ev.n_columns, ev.column_labels, 40), { tickangle: -45 }),
      yaxis: { range: [1.005, -0.005], tickformat: ".0%", title: { text: "share of documents" }, zeroline: false },
      legend: { orientation: "h", y: 1.06, x: 0 }, plot_bgcolor: "#fbfbfc",
    };
    Plotly.react("evolution", evolutionTraces(lay), layout, CONFIG);
    $("evolution-note").textContent = count(lay.n_bands, "band") + " shown, " + count(lay.n_folded, "node") + " folded" +
      (ev.per_column > 1 ? "; " + ev.per_column + " consecutive epochs per column (" + count(nEpochs, "epoch") + ")"
        : "");
  }
  function setupEvolution() {
    const ev = D.evolution;
    if (!ev) { $("evolution-note").textContent = "no published epochs"; return; }
    const sel = $("threshold");
    ev.layouts.forEach((lay, i) => {
      const o = el("option", pct(lay.threshold) + " (" + count(lay.n_bands, "band") + ")");
      o.value = String(i);
      sel.appendChild(o);
    });
    sel.value = String(ev.default);
    sel.addEventListener("change", () => drawEvolution(Number(sel.value)));
    drawEvolution(ev.default);
    $("evolution").on("plotly_click", (e) => {
      const p = e.points && e.points[0];
      if (p && p.customdata !== undefined) showLineage(p.customdata);
    });
  }

  // ---- one epoch's tree ------------------------------------------------------------------
  // a node takes the colour of its nearest ancestor (or itself) that has a band in the
  // evolving tree at the finest offered threshold, so both views colour a branch alike
  const bandColour = new Map();
  if (D.evolution) for (const b of D.evolution.layouts[0].bands) bandColour.set(b.id, b.colour);
  function epochColours(rows, all) {
    const parentOf = new Map(all.map((r) => [N.id[r], N.parent[r]]));
    return rows.map((r) => {
      let id = N.id[r];
      for (let hops = 0; hops < 64 && id >= 0; hops++) {
        if (bandColour.has(id)) return bandColour.get(id);
        id = parentOf.has(id) ? parentOf.get(id) : -1;
      }
      return "#9aa0a6";
    });
  }
  function drawEpoch(e) {
    const all = rowsOfEpoch[e], chart = $("epoch-chart").value;
    const rows = all.filter((r) => !relayRows.has(r)); // a relay chain is one box, with the node it leads to
    const via = (r) => (N.via[r] || []).map((x) => N.id[x]);
    const docs = E.n_documents[e];
    const trace = {
      type: chart, ids: rows.map((r) => "n" + N.id[r]), labels: rows.map((r) => via(r).concat([N.id[r]]).join(" › ") +
        ": " + N.words[r].split(" ").slice(0, 3).join(" ")),
      parents: rows.map((r) => {
        const top = N.via[r] ? N.via[r][0] : r;
        return N.parent[top] < 0 ? "" : "n" + N.parent[top];
      }),
      values: rows.map((r) => N.subtree[r]), branchvalues: "total", customdata: rows.map((r) => N.id[r]),
      text: rows.map((r) => nodeHover(r, "<br>" + count(N.subtree[r], "document") + " in the subtree (" +
        pct(docs ? N.subtree[r] / docs : 0) + "), " + fmt(N.count[r]) + " at the node", via(r))),
      hovertemplate: "%{text}<extra></extra>", textinfo: "label", maxdepth: -1,
      marker: { colors: epochColours(rows, all), line: { width: 1, color: "white" } },
      meta: { kind: "epoch-tree", epoch: e },
    };
    if (chart !== "treemap") trace.insidetextorientation = "horizontal";
    Plotly.react("epoch-tree", [trace], { font: FONT, margin: { l: 4, r: 4, t: 4, b: 4 } }, CONFIG);
    $("epoch").value = String(e);
    const relays = all.length - rows.length;
    $("epoch-note").textContent = count(all.length, "node") + (relays ? " (" + fmt(relays) + " of them " +
      noun(relays, "a relay, in the box of the node its chain leads to", "relays, in the box of the node their chain " +
        "leads to") + ")" : "") + ", " + count(docs, "document") + ", " +
      fmt(E.born[e]) + " born, " + fmt(E.died[e]) + " died, " + fmt(E.merged[e]) + " merged, " +
      (E.relay[e] ? count(E.relay[e], "relay change") + ", " : "") + count(E.n_rejects[e], "reject");
  }
  function setupEpoch() {
    const sel = $("epoch");
    if (!nEpochs) { $("epoch-note").textContent = "no published epochs"; return; }
    for (let e = 0; e < nEpochs; e++) {
      const o = el("option", E.label[e] + " (epoch " + E.epoch[e] + ")");
      o.value = String(e);
      sel.appendChild(o);
    }
    let largest = 0;
    for (let e = 0; e < nEpochs; e++) if (E.n_documents[e] > E.n_documents[largest]) largest = e;
    sel.addEventListener("change", () => drawEpoch(Number(sel.value)));
    $("epoch-chart").addEventListener("change", () => drawEpoch(Number(sel.value)));
    $("epoch-prev").addEventListener("click", () => drawEpoch(Math.max(0, Number(sel.value) - 1)));
    $("epoch-next").addEventListener("click", () => drawEpoch(Math.min(nEpochs - 1, Number(sel.value) + 1)));
    drawEpoch(largest);
    $("epoch-tree").on("plotly_click", (e) => {
      const p = e.points && e.points[0];
      if (p && p.customdata !== undefined) showLineage(p.customdata);
    });
  }

  // ---- a node's lineage ------------------------------------------------------------------
  function showLineage(id, quiet) {
    id = Number(id);
    $("node-id").value = String(id);
    const rows = rowsOfId.get(id);
    if (!rows) {
      $("lineage-note").textContent = "node " + id + " is in no published epoch";
      return;
    }
    $("lineage-note").textContent = "";
    const first = rows[0], last = rows[rows.length - 1];
    const own = eventsOfId.get(id) || [], toMe = eventsToId.get(id) || [];
    const head = $("lineage-head");
    head.replaceChildren();
    const p1 = el("p");
    const bornHere = N.born[first] === E.epoch[N.e[first]];
    p1.append(el("b", "node " + id), (bornHere ? " born in " + E.label[N.e[first]]
      : " first seen in " + E.label[N.e[first]] + " (born in epoch " + N.born[first] + ")") +
      ", last seen in " + E.label[N.e[last]] + (N.e[last] === nEpochs - 1 ? " (alive)" : "") + "; alive in " +
      rows.length + " of " + count(nEpochs, "epoch") + ". Words at its peak: ");
    let peak = first;
    for (const r of rows) if (N.subtree[r] / Math.max(1, E.n_documents[N.e[r]]) > N.subtree[peak] / Math.max(1, E.n_documents[N.e[peak]])) peak = r;
    p1.append(el("i", N.words[peak]));
    head.appendChild(p1);
    const groups = [
      ["split from", own.filter((i) => EV.kind[i] === "split_from").map((i) => EV.other[i])],
      ["merged into", own.filter((i) => EV.kind[i] === "merged_into").map((i) => EV.other[i])],
      ["nodes that split from it", toMe.filter((i) => EV.kind[i] === "split_from").map((i) => EV.id[i])],
      ["nodes merged into it", toMe.filter((i) => EV.kind[i] === "merged_into").map((i) => EV.id[i])],
      ["parents", [...new Set(rows.map((r) => N.parent[r]).filter((p) => p >= 0))]],
      ["children (any epoch)", [...new Set(N.id.filter((_, r) => N.parent[r] === id))]],
    ];
    for (const [name, ids] of groups) {
      if (!ids.length) continue;
      const p = el("p", name + ": ");
      ids.slice(0, 60).forEach((x, j) => { if (j) p.append(", "); p.append(nodeLink(x)); });
      if (ids.length > 60) p.append(" and " + (ids.length - 60) + " more");
      head.appendChild(p);
    }
    const share = new Array(nEpochs).fill(null), mass = new Array(nEpochs).fill(null);
    for (const r of rows) {
      share[N.e[r]] = E.n_documents[N.e[r]] ? N.subtree[r] / E.n_documents[N.e[r]] : 0;
      mass[N.e[r]] = N.mass[r];
    }
    const xs = [...Array(nEpochs).keys()];
    Plotly.react("lineage-plot", [
      { type: "scatter", mode: "lines+markers", x: xs, y: share, name: "share of documents (subtree)",
        hovertemplate: "%{y:.2%}<extra>share</extra>", connectgaps: false, meta: { kind: "lineage-share", node: id } },
      { type: "scatter", mode: "lines+markers", x: xs, y: mass, name: "mass (stick weight)", yaxis: "y2",
        hovertemplate: "%{y:.4g}<extra>mass</extra>", connectgaps: false, line: { dash: "dot" },
        meta: { kind: "lineage-mass", node: id } },
    ], {
      font: FONT, margin: { l: 60, r: 60, t: 10, b: 60 }, legend: { orientation: "h", y: 1.15 },
      xaxis: Object.assign(epochAxis(nEpochs, E.label, 30), { tickangle: -45, anchor: "y2" }),
      // two panels, share above and mass below: on one plot with an axis each, the two points
      // of a node alive in one epoch (or any two series of one shape) fell on each other
      yaxis: { tickformat: ".1%", title: { text: "share" }, rangemode: "tozero", domain: [0.55, 1] },
      yaxis2: { anchor: "x", title: { text: "mass" }, rangemode: "tozero", domain: [0, 0.42] },
    }, CONFIG);
    const evAt = new Map();
    for (const i of own) {
      if (!evAt.has(EV.e[i])) evAt.set(EV.e[i], []);
      evAt.get(EV.e[i]).push(i);
    }
    const tableRows = rows.map((r) => {
      const evs = el("span");
      (evAt.get(N.e[r]) || []).forEach((i, j) => {
        if (j) evs.append("; ");
        evs.append(MARKS[EV.kind[i]].name);
        if (EV.other[i] >= 0) { evs.append(" "); evs.append(nodeLink(EV.other[i])); }
      });
      return [E.label[N.e[r]], N.parent[r] >= 0 ? nodeLink(N.parent[r]) : "root", N.subtree[r], N.count[r],
        pct(E.n_documents[N.e[r]] ? N.subtree[r] / E.n_documents[N.e[r]] : 0), String(N.mass[r]), N.words[r], evs];
    });
    const died = own.filter((i) => EV.kind[i] === "died" || EV.kind[i] === "merged_into");
    for (const i of died) {
      const evs = el("span", MARKS[EV.kind[i]].name);
      if (EV.other[i] >= 0) { evs.append(" "); evs.append(nodeLink(EV.other[i])); }
      tableRows.push([E.label[EV.e[i]], "", "", "", "", "", "", evs]);
    }
    fillTable($("lineage-table"), ["epoch", "parent", "docs (subtree)", "docs (node)", "share", "mass",
      "words", "events"], tableRows);
    if (!quiet) $("lineage-section").scrollIntoView({ behavior: "smooth", block: "start" });
  }
  function setupLineage() {
    const go = () => { const v = $("node-id").value; if (v !== "") showLineage(Number(v)); };
    $("node-show").addEventListener("click", go);
    $("node-id").addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
    // start with the node that held the largest share of documents over the run, the root aside
    let best = -1, bestShare = -1;
    for (let r = 0; r < N.id.length; r++) {
      if (N.parent[r] < 0) continue;
      const s = N.subtree[r] / Math.max(1, E.n_documents[N.e[r]]) * rowsOfId.get(N.id[r]).length;
      if (s > bestShare) { bestShare = s; best = N.id[r]; }
    }
    if (best >= 0) showLineage(best, true);
    else if (N.id.length) showLineage(N.id[0], true);
  }

  // ---- static hierarchies --------------------------------------------------------------
  function drawStatic(i) {
    const s = D.static[i];
    const many = s.n_leaves > 60;
    // room for the leaf names, written at -60 degrees: about 0.87 of their length below the axis
    // and half of it to the left of the first leaf (12 px text, ~6.5 px a character)
    const longest = many ? 0 : Math.max(0, ...s.leaf_labels.map((t) => String(t).length));
    const below = many ? 20 : Math.min(300, 30 + Math.ceil(longest * 6.5 * 0.87));
    const left = many ? 60 : Math.max(60, Math.min(220, Math.ceil(longest * 6.5 * 0.5)));
    Plotly.react("dendrogram", [
      { type: "scatter", mode: "lines", x: s.x, y: s.y, hoverinfo: "skip", line: { color: "#0072B2", width: 1 },
        showlegend: false, meta: { kind: "dendrogram", leaves: s.n_leaves } },
      { type: "scatter", mode: "markers", x: s.leaf_x, y: s.leaf_x.map(() => 0), text: s.leaf_labels.map(esc),
        hovertemplate: "%{text}<extra></extra>", marker: { size: 5, color: "#59636e" }, showlegend: false },
    ], {
      font: FONT, margin: { l: left, r: 10, t: 10, b: below }, hovermode: "closest",
      xaxis: many ? { showticklabels: false, showgrid: false, zeroline: false }
        : { tickvals: s.leaf_x, ticktext: s.leaf_labels.map(esc), tickangle: -60, showgrid: false, zeroline: false },
      yaxis: { title: { text: "merge height" }, zeroline: false },
    }, CONFIG);
    $("static-note").textContent = count(s.n_leaves, "leaf", "leaves") + (s.over ? " (" + s.over + ")" : "") +
      (many ? "; hover the leaves for their names" : "");
  }
  function setupStatic() {
    const sel = $("static");
    if (!D.static.length) {
      sel.style.display = "none";
      $("static-note").textContent = "This store has no static hierarchies (replay with --static bhc, " +
        "or run streamtree snapshot STORE --method bhc --epoch E).";
      $("dendrogram").style.display = "none";
      return;
    }
    D.static.forEach((s, i) => {
      const o = el("option", s.label + ": " + s.method + (s.over ? " over " + s.over : ""));
      o.value = String(i);
      sel.appendChild(o);
    });
    sel.addEventListener("change", () => drawStatic(Number(sel.value)));
    drawStatic(0);
  }

  // ---- run summary -------------------------------------------------------------------------
  function setupSummary() {
    const S = D.summary, xs = [...Array(nEpochs).keys()];
    Plotly.react("documents-plot", [
      { type: "bar", x: xs, y: E.n_documents, name: "documents fitted", marker: { color: "#0072B2" },
        text: E.label.map((l, e) => l + ": " + count(E.n_documents[e], "document")), textposition: "none",
        hovertemplate: "%{text}<extra></extra>",
        meta: { kind: "documents" } },
      { type: "bar", x: xs, y: E.n_rejects, name: "records rejected", marker: { color: "#D55E00" },
        text: E.label, textposition: "none", hovertemplate: "%{text}: %{y} rejected<extra></extra>" },
      { type: "scatter", mode: "lines", x: xs, y: E.n_nodes, name: "nodes", yaxis: "y2", line: { color: "#009E73" },
        text: E.label.map((l, e) => l + ": " + count(E.n_nodes[e], "node")), hovertemplate: "%{text}<extra></extra>" },
    ], {
      font: FONT, barmode: "stack", margin: { l: 60, r: 60, t: 10, b: 60 }, legend: { orientation: "h", y: 1.15 },
      xaxis: Object.assign(epochAxis(nEpochs, E.label, 30), { tickangle: -45 }),
      yaxis: { title: { text: "records" } },
      yaxis2: { overlaying: "y", side: "right", title: { text: "nodes" }, rangemode: "tozero", showgrid: false,
        tickformat: ",d" },
    }, CONFIG);
    const reasons = Object.entries(S.rejects_by_reason);
    fillTable($("rejects-table"), ["reason", "records"], reasons.length ? reasons : [["(none)", 0]]);
    fillTable($("events-table"), ["event", "count"], Object.keys(S.event_counts).map((k) => [MARKS[k].name,
      S.event_counts[k]]).concat(S.relay_changes ? [["relay changes (a relay born, a relay that never had a box " +
      "of its own gone or merged, or a parent change that leaves a box where it was; not counted above)",
      S.relay_changes]] : []));
    fillTable($("config-table"), ["setting", "value"],
      S.config.concat(Object.entries(S.versions).map(([k, v]) => ["version." + k, v])));
  }

  function fail(err) {
    const box = el("div", "The report could not be drawn: " + (err && err.stack ? err.stack : err));
    box.id = "report-error";
    document.body.prepend(box);
    throw err;
  }
  try {
    keyFigures();
    setupEvolution();
    setupEpoch();
    setupLineage();
    setupStatic();
    setupSummary();
    document.body.dataset.ready = String(Math.max(1, Math.round(performance.now())));
  } catch (err) {
    fail(err);
  }
})();
