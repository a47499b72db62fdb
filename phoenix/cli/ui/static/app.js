// phoenix ui: polls /api/pipelines and draws each pipeline as its DAG in SVG. Read-only; every text from the
// server goes in through textContent, never as markup. The bearer token comes in the URL's fragment (#token=...),
// which a browser never sends to a server, and is kept in this tab's sessionStorage only.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const BOX = { width: 220, height: 150, columnGap: 120, rowGap: 28, margin: 12 };
const FIGURES = [
  ["backlog", "backlog"],
  ["in_flight", "in flight"],
  ["rate", "rate"],
  ["dlq", "DLQ"],
  ["replicas", "replicas"],
];
let token = null;
let intervalMs = 2000;
let openDlq = null; // [namespace, stage] of the dead letters shown

function readToken() {
  const match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
  if (match) {
    sessionStorage.setItem("phoenix-ui-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", window.location.pathname + window.location.search);
  }
  token = sessionStorage.getItem("phoenix-ui-token");
}

async function getJson(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) {
    throw new Error("not authorized: open this page as …/#token=YOUR_TOKEN (the token of --token-file)");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function el(name, attributes, text) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function html(name, attributes, text) {
  const node = document.createElement(name);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function shown(value, unit) {
  if (value === null || value === undefined) return "-";
  return unit ? value + unit : String(value);
}

function seconds(value) {
  if (value === null || value === undefined) return "-";
  if (value < 120) return value + " s";
  if (value < 7200) return Math.round(value / 60) + " min";
  return Math.round(value / 3600) + " h";
}

function place(stages) {
  const rows = {};
  const at = {};
  for (const stage of stages) {
    const row = rows[stage.column] || 0;
    rows[stage.column] = row + 1;
    at[stage.name] = {
      x: BOX.margin + stage.column * (BOX.width + BOX.columnGap),
      y: BOX.margin + row * (BOX.height + BOX.rowGap),
    };
  }
  const columns = Math.max(...stages.map((s) => s.column)) + 1;
  const height = Math.max(...Object.values(rows));
  return {
    at,
    width: 2 * BOX.margin + columns * BOX.width + (columns - 1) * BOX.columnGap,
    height: 2 * BOX.margin + height * BOX.height + (height - 1) * BOX.rowGap,
  };
}

function drawEdge(svg, edge, at) {
  const from = at[edge.source];
  const to = at[edge.target];
  const x1 = from.x + BOX.width;
  const y1 = from.y + BOX.height / 2;
  const x2 = to.x;
  const y2 = to.y + BOX.height / 2;
  const bend = Math.max(40, (x2 - x1) / 2);
  const g = el("g", { class: "edge", "data-edge": edge.source + "->" + edge.target });
  g.append(el("path", { d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2 - 6},${y2}`, "marker-end": "url(#arrow)" }));
  const label = (edge.output ? edge.output + ": " : "") + "lag " + shown(edge.lag);
  const mx = (x1 + x2) / 2;
  const my = (y1 + y2) / 2;
  g.append(el("rect", { x: mx - 4 * label.length - 6, y: my - 11, width: 8 * label.length + 12, height: 20, rx: 4 }));
  g.append(el("text", { x: mx, y: my + 4, "text-anchor": "middle", "data-figure": "lag" }, label));
  svg.append(g);
}

function drawBox(svg, stage, pipeline, at) {
  const { x, y } = at[stage.name];
  const classes = ["box"];
  if (stage.ready) classes.push("ready");
  if (stage.backpressure) classes.push("throttled");
  const g = el("g", { class: classes.join(" "), "data-stage": stage.name, transform: `translate(${x},${y})` });
  g.append(el("rect", { class: "frame", width: BOX.width, height: BOX.height, rx: 8 }));
  g.append(el("circle", { cx: 16, cy: 20, r: 5, fill: stage.ready ? "#2f9e44" : "#e8590c" }));
  g.append(el("text", { class: "name", x: 28, y: 25 }, stage.name));
  const badges = [];
  if (stage.backpressure) badges.push(["throttled", "backpressure"]);
  if (stage.paused) badges.push(["paused", "paused"]);
  badges.forEach(([kind, text], i) => {
    const badge = el("g", { class: "badge " + kind, "data-figure": kind, transform: `translate(${BOX.width - 94},${12 + i * 20})` });
    badge.append(el("rect", { width: 84, height: 17, rx: 8 }));
    badge.append(el("text", { x: 42, y: 12.5, "text-anchor": "middle" }, text));
    g.append(badge);
  });
  FIGURES.forEach(([key, label], i) => {
    const line = el("g", { transform: `translate(16,${50 + i * 20})` });
    let value = shown(stage[key]);
    if (key === "rate") value = stage.rate === null ? "-" : stage.rate.toFixed(1) + "/s";
    const cls = key === "dlq" && stage.dlq > 0 ? "value bad" : "value";
    line.append(el("text", { class: "label" }, label));
    line.append(el("text", { class: cls, x: BOX.width - 32, "text-anchor": "end", "data-figure": key }, value));
    if (key === "dlq") {
      line.setAttribute("class", "dlq-link");
      line.addEventListener("click", () => showDlq(pipeline.namespace, stage.name));
    }
    g.append(line);
  });
  svg.append(g);
}

function drawPipeline(pipeline) {
  const card = html("section", { class: "pipeline", "data-pipeline": pipeline.namespace + "/" + pipeline.name });
  card.append(html("h2", {}, pipeline.namespace + " / " + pipeline.name));
  const figures = html("div", { class: "figures" });
  const grouped = pipeline.labelled ? " of a PhoenixPipeline" : " joined by their outputs";
  figures.append(html("span", { class: "muted" }, pipeline.stages.length + " stages" + grouped));
  const oldest = html("span", {}, "OLDEST ");
  oldest.append(html("b", { "data-figure": "oldest" }, seconds(pipeline.oldest_seconds)));
  const p99 = html("span", { title: "end-to-end latency over the last minutes, from the final stages' status" }, "P99 end to end ");
  p99.append(html("b", { "data-figure": "p99" }, pipeline.p99_seconds === null ? "-" : pipeline.p99_seconds + " s"));
  figures.append(oldest, p99);
  card.append(figures);
  const layout = place(pipeline.stages);
  const svg = el("svg", { width: layout.width, height: layout.height, viewBox: `0 0 ${layout.width} ${layout.height}` });
  const defs = el("defs");
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
  marker.append(el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa5b1" }));
  defs.append(marker);
  svg.append(defs);
  for (const edge of pipeline.edges) drawEdge(svg, edge, layout.at);
  for (const stage of pipeline.stages) drawBox(svg, stage, pipeline, layout.at);
  card.append(svg);
  return card;
}

function showProblem(lines) {
  const problem = document.getElementById("problem");
  problem.hidden = lines.length === 0;
  problem.textContent = lines.join(" · ");
}

async function refresh() {
  try {
    const snapshot = await getJson("/api/pipelines");
    intervalMs = (snapshot.intervalSeconds || 2) * 1000;
    const main = document.getElementById("pipelines");
    main.replaceChildren(...snapshot.pipelines.map(drawPipeline));
    if (snapshot.pipelines.length === 0) main.append(html("p", { class: "muted" }, "No PhoenixStages found."));
    const updated = document.getElementById("updated");
    updated.textContent = snapshot.at ? "read " + snapshot.at + ", every " + intervalMs / 1000 + " s" : "not read yet";
    showProblem([snapshot.error, ...(snapshot.problems || [])].filter(Boolean));
    if (openDlq) await showDlq(...openDlq);
  } catch (error) {
    showProblem([error.message]);
  }
  setTimeout(refresh, intervalMs);
}

async function showDlq(namespace, stage) {
  openDlq = [namespace, stage];
  const section = document.getElementById("dlq");
  section.hidden = false;
  document.getElementById("dlq-title").textContent = "Dead letters of " + namespace + " / " + stage;
  let found;
  try {
    found = await getJson(`/api/stages/${encodeURIComponent(namespace)}/${encodeURIComponent(stage)}/dlq`);
  } catch (error) {
    document.getElementById("dlq-note").textContent = error.message;
    return;
  }
  const columns = [["id", "entry"], ["record_id", "record"], ["error_type", "error type"], ["error", "reason"],
    ["first_seen", "first seen"], ["attempts", "attempts"]];
  if (found.data) columns.push(["data", "data"]);
  document.getElementById("dlq-note").textContent = `${found.entries.length} oldest of ${found.length}` +
    (found.data ? "" : "; record data hidden (phoenix ui --show-data shows it)");
  document.getElementById("dlq-head").replaceChildren(...columns.map(([, title]) => html("th", {}, title)));
  const rows = found.entries.map((entry) => {
    entry.first_seen = entry.first_failed_at || entry.failed_at;
    const row = html("tr", { "data-entry": entry.id });
    for (const [key] of columns) {
      row.append(html("td", { class: key === "error" || key === "data" ? "reason" : "nowrap" }, shown(entry[key])));
    }
    return row;
  });
  document.getElementById("dlq-rows").replaceChildren(...rows);
}

readToken();
refresh();
