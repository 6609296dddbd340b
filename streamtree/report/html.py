"""The report page: one self-contained HTML file (plotly.js, the data and the page script
inlined; no network access when it is opened)."""

from __future__ import annotations

import html
import json
from importlib import resources

from streamtree import __version__
from streamtree.relays import RELAY_LEGEND
from streamtree.report.data import EMPTY_BAND, EMPTY_BANDS_MAX


def plotly_js() -> str:
    """The minified plotly.js bundled with the ``plotly`` Python package."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:  # a declared dependency; say what to do if it is missing anyway
        raise ImportError("the report needs the 'plotly' package: pip install plotly") from None
    return get_plotlyjs()


def _asset(name: str) -> str:
    return resources.files("streamtree.report").joinpath(name).read_text(encoding="utf-8")


def _script_json(data: dict) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` can end it early)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render(data: dict) -> str:
    """The report page for :func:`streamtree.report.data.report_data`'s ``data``."""
    title = html.escape(data["title"])
    relays = html.escape(f"a › b (in a label or hover): {RELAY_LEGEND}.")
    unfinished = (f'<p class="note" id="unfinished">Note: {html.escape(data["unfinished"])}.</p>\n  '
                  if data.get("unfinished") else "")
    thin, thin_max = f"{100 * EMPTY_BAND:g}", f"{100 * EMPTY_BANDS_MAX:g}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="streamtree {html.escape(__version__)}">
<title>{title}</title>
<style>
{_asset("report.css")}
</style>
<script>
{plotly_js()}
</script>
</head>
<body>
<header>
  <h1>{title}</h1>
  <p class="sub">Store <code>{html.escape(data["store"])}</code>. Hover for details; click a node (a band, a box)
  to follow it across epochs.</p>
  {unfinished}<div id="key-figures" class="figures"></div>
</header>
<main>
<section id="evolution-section">
  <h2>The evolving tree</h2>
  <p class="help">One column per epoch, one band per node; a band's height is its share of the column's
  documents (its own and those of smaller descendants folded into it). Bands are stacked in tree order, a
  node above its children, so a subtree is one contiguous block. Markers: <span class="m born">&#9654;</span>
  born, <span class="m died">&#10006;</span> died, <span class="m split">&#9664;</span> split from,
  <span class="m merged">&#9679;</span> merged into (a merge is the node's end: it is not marked died too;
  a line joins the node it merged into), <span class="m merged">&#9650;</span> merged into the root (whose band
  tops the column: no line),
  <span class="m moved">&#9670;</span> parent changed.
  A node whose documents all sit below it and that has two or more children is a thin band above them
  ({thin}% of the column, together at most {thin_max}%, the other bands sharing the rest); one with a single
  child is drawn with that child.
  {relays}</p>
  <div class="controls">
    <label>Fold nodes whose subtree never held at least
      <select id="threshold"></select> of a column's documents</label>
    <span id="evolution-note" class="note"></span>
  </div>
  <div id="evolution" class="plot tall"></div>
</section>
<section id="epoch-section">
  <h2>One epoch's tree</h2>
  <p class="help">One box per node, sized by the documents in its subtree, inside its parent's. {relays}</p>
  <div class="controls">
    <button id="epoch-prev" type="button" title="previous epoch">&#9664;</button>
    <select id="epoch"></select>
    <button id="epoch-next" type="button" title="next epoch">&#9654;</button>
    <label>as <select id="epoch-chart">
      <option value="icicle">icicle</option><option value="treemap">treemap</option>
      <option value="sunburst">sunburst</option></select></label>
    <span id="epoch-note" class="note"></span>
  </div>
  <div id="epoch-tree" class="plot"></div>
</section>
<section id="lineage-section">
  <h2>A node's lineage</h2>
  <div class="controls">
    <label>Node id <input id="node-id" type="number" min="0" step="1"></label>
    <button id="node-show" type="button">show</button>
    <span id="lineage-note" class="note"></span>
  </div>
  <div id="lineage-head"></div>
  <div id="lineage-plot" class="plot short"></div>
  <div class="table-wrap"><table id="lineage-table"></table></div>
</section>
<section id="static-section">
  <h2>Static hierarchies</h2>
  <div class="controls"><select id="static"></select> <span id="static-note" class="note"></span></div>
  <div id="dendrogram" class="plot"></div>
</section>
<section id="summary-section">
  <h2>Run summary</h2>
  <div id="documents-plot" class="plot short"></div>
  <div class="columns">
    <div><h3>Rejected records by reason</h3><table id="rejects-table"></table></div>
    <div><h3>Events</h3><table id="events-table"></table></div>
    <div><h3>Configuration</h3><table id="config-table"></table></div>
  </div>
</section>
</main>
<footer>Made by streamtree {html.escape(__version__)} with plotly.js; everything is in this file.</footer>
<script type="application/json" id="report-data">{_script_json(data)}</script>
<script>
{_asset("report.js")}
</script>
</body>
</html>
"""
