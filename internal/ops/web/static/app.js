// weft overlay page: draws the snapshots that /api/events pushes and asks
// /api/path for a packet's path. No framework, no inline code (the
// Content-Security-Policy forbids it).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
let prev = null;       // the previous snapshot, for rates and events
let rates = {};        // node name → {tx, rx, txB, rxB} per second
let chosen = null;     // the path shown: {srcNode, dstNode, srcPod, dstPod}
let drops = [];        // the latest dropped flows, drawn between their pods
const $ = (id) => document.getElementById(id);

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function sv(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fmt(n) {
  if (n === undefined || n === null || isNaN(n)) return "–";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + " M";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + " k";
  return n.toFixed(n < 10 && n % 1 ? 1 : 0);
}
function sum(m) { return Object.values(m || {}).reduce((a, b) => a + b, 0); }

function computeRates(s) {
  const out = {};
  if (!prev) return out;
  const dt = (new Date(s.time) - new Date(prev.time)) / 1000;
  if (dt <= 0) return rates;
  for (const n of s.nodes) {
    const p = prev.nodes.find((q) => q.name === n.name);
    if (!n.counters || !p || !p.counters) continue;
    const d = (k) => Math.max(0, n.counters[k] - p.counters[k]) / dt;
    out[n.name] = { tx: d("txFrames"), rx: d("rxFrames"), txB: d("txBytes"), rxB: d("rxBytes") };
  }
  return out;
}

function logEvent(text, bad) {
  const li = el("li", bad ? { class: "bad" } : {}, new Date().toLocaleTimeString() + " " + text);
  $("events").prepend(li);
  while ($("events").children.length > 200) $("events").lastChild.remove();
}

function events(s) {
  if (!prev) return;
  const key = (n) => n.subnet + " " + n.underlay;
  const before = new Map(prev.nodes.map((n) => [key(n), n]));
  const now = new Map(s.nodes.map((n) => [key(n), n]));
  for (const [k, n] of now) if (!before.has(k) && n.subnet) logEvent("+ lease " + n.subnet + " of " + n.name + " (" + n.underlay + ") appeared");
  for (const [k, n] of before) if (!now.has(k) && n.subnet) logEvent("- lease " + n.subnet + " of " + n.name + " (" + n.underlay + ") is gone", true);
  for (const n of s.nodes) {
    const p = prev.nodes.find((q) => q.name === n.name);
    if (!p || !n.counters || !p.counters) continue;
    for (const [kind, v] of Object.entries(n.counters.repairs || {})) {
      const d = v - ((p.counters.repairs || {})[kind] || 0);
      if (d > 0) logEvent("repair: " + n.name + ": weftd repaired " + d + " × " + kind + " (drift put back)", true);
    }
    const r = n.counters.rejected - p.counters.rejected;
    if (r > 0) logEvent("⊘ " + n.name + ": weftd rejected " + r + " lease event(s)", true);
  }
  const had = new Set(prev.rejected.map((r) => r.key));
  for (const r of s.rejected) if (!had.has(r.key)) logEvent("⊘ rejected lease " + r.key + ": " + r.reason, true);
}

// layout places the nodes: around an ellipse on a wide screen, in one
// column on a narrow one (links then bend out to the right).
function layout(nodes, narrow) {
  const pos = {};
  const n = nodes.length;
  if (narrow) {
    let y = 20;
    for (const node of nodes) {
      const h = boxHeight(node);
      pos[node.name] = { x: 175, y: y + h / 2, h: h };
      y += h + 40;
    }
    return { pos: pos, width: 480, height: Math.max(y, 200) };
  }
  const cx = 500, cy = 320, rx = n <= 1 ? 0 : 330, ry = n <= 2 ? 0 : 190;
  nodes.forEach((node, i) => {
    const a = n === 2 ? Math.PI * i : -Math.PI / 2 + (2 * Math.PI * i) / Math.max(n, 1);
    pos[node.name] = { x: cx + rx * Math.cos(a), y: cy + ry * Math.sin(a), h: boxHeight(node) };
  });
  return { pos: pos, width: 1000, height: 640 };
}
function boxHeight(n) { return 70 + 24 * n.pods.length; }
const BOX = 330;

function drawSVG(s) {
  const links = $("links-layer"), nodes = $("nodes-layer");
  links.replaceChildren();
  nodes.replaceChildren();
  const narrow = $("drawing").clientWidth < 600;
  const lay = layout(s.nodes, narrow), pos = lay.pos;
  $("drawing").setAttribute("viewBox", "0 0 " + lay.width + " " + lay.height);
  let bend = 0;
  for (const l of s.links) {
    const a = pos[l.a], b = pos[l.b];
    const bad = l.state.some((x) => !x.endsWith(": ok"));
    const on = chosen && ((chosen.srcNode === l.a && chosen.dstNode === l.b) || (chosen.srcNode === l.b && chosen.dstNode === l.a));
    const g = sv("g", { class: "link" + (bad ? " problem" : "") + (on ? " on-path" : ""), "data-link": l.id });
    g.append(sv("title", {}, l.a + " ↔ " + l.b + ", " + l.kind + ": " + (l.state.join("; ") || "not observed")));
    // No rates on a link: weftd counts per node, not per peer (the node
    // boxes and the links table show them).
    const label = (on ? "▶ " : "") + (bad ? "✗ " : "✓ ") + (narrow ? "" : l.kind);
    if (narrow) {
      const x = a.x + BOX / 2, c = x + 40 + 30 * (bend++ % 4), my = (a.y + b.y) / 2;
      g.append(sv("path", { d: "M" + x + "," + a.y + " Q" + c + "," + my + " " + x + "," + b.y }));
      g.append(sv("text", { x: x + (c - x) / 2 + 6, y: my + 5 }, label));
    } else {
      g.append(sv("path", { d: "M" + a.x + "," + a.y + " L" + b.x + "," + b.y }));
      g.append(sv("text", { x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 - 8, "text-anchor": "middle" }, label));
    }
    links.append(g);
  }
  for (const n of s.nodes) {
    const p = pos[n.name], w = BOX, h = p.h;
    const cls = "node" + (n.rejected ? " rejected" : "") + (n.subnet ? "" : " gone");
    const g = sv("g", { class: cls, "data-node": n.name, transform: "translate(" + (p.x - w / 2) + "," + (p.y - h / 2) + ")" });
    g.append(sv("title", {}, nodeText(n)));
    g.append(sv("rect", { class: "box", width: w, height: h, rx: 8 }));
    g.append(sv("text", { class: "name", x: 10, y: 22 }, (n.rejected ? "⊘ " : "") + n.name + "  " + n.underlay));
    g.append(sv("text", { x: 10, y: 42 }, (n.subnet || "no lease") + " · " + (n.device || n.backend || "")));
    const r = rates[n.name];
    g.append(sv("text", { x: 10, y: 60, "data-rate": n.name }, r ? "out " + fmt(r.tx) + " · in " + fmt(r.rx) + " frames/s" : (n.observed ? "rates: next update" : "not observed")));
    n.pods.forEach((pod, i) => {
      const on = chosen && (chosen.srcPod === pod.name || chosen.dstPod === pod.name);
      const pg = sv("g", { class: "pod" + (on ? " on-path" : ""), "data-pod": pod.name, transform: "translate(10," + (68 + 24 * i) + ")" });
      pg.append(sv("rect", { width: w - 20, height: 21, rx: 4 }));
      const mark = on ? (chosen.srcPod === pod.name ? "▶ " : "◎ ") : "";
      pg.append(sv("text", { x: 6, y: 16 }, mark + pod.name + " " + pod.ip + (pod.veth ? " · " + pod.veth : "")));
      g.append(pg);
    });
    nodes.append(g);
  }
  drawDrops(s, pos);
  $("svg-desc").textContent = s.nodes.length + " nodes and " + s.links.length + " links; the same facts are in the Nodes and Links tables below. " +
    s.nodes.map(nodeText).join(" ");
}

// podAt is where pod ip is drawn: its row's left and right ends.
function podAt(s, pos, ip) {
  for (const n of s.nodes) {
    const i = n.pods.findIndex((p) => p.ip === ip);
    if (i < 0 || !pos[n.name]) continue;
    const p = pos[n.name], y = p.y - p.h / 2 + 68 + 24 * i + 10;
    return { name: n.pods[i].name, l: p.x - BOX / 2 + 10, r: p.x + BOX / 2 - 10, y: y, node: n.name };
  }
  return null;
}

// drawDrops draws each of the latest drops whose pods are both on the page:
// a dotted line from one pod's row to the other's, bending out to the
// right, labelled with the policies.
function drawDrops(s, pos) {
  const layer = $("flows-layer");
  layer.replaceChildren();
  const seen = new Set();
  for (const f of drops) {
    const a = podAt(s, pos, f.src), b = podAt(s, pos, f.dst);
    const key = f.src + ">" + f.dst;
    if (!a || !b || seen.has(key)) continue;
    seen.add(key);
    const g = sv("g", { class: "drop", "data-drop": key });
    g.append(sv("title", {}, "dropped " + f.proto + " " + a.name + " → " + b.name + (f.dstPort ? ":" + f.dstPort : "") + ": " + f.reason));
    const x1 = a.r, x2 = b.r, c = Math.max(x1, x2) + 50 + 20 * (seen.size % 3);
    g.append(sv("path", { d: "M" + x1 + "," + a.y + " C" + c + "," + a.y + " " + c + "," + b.y + " " + x2 + "," + b.y }));
    g.append(sv("text", { x: 0.125 * (x1 + x2) + 0.75 * c + 8, y: (a.y + b.y) / 2 + 5 }, "✗ " + (f.policies || []).join(", ")));
    layer.append(g);
  }
}

function fmtBytes(c) {
  if (!c) return "";
  return fmt(c.origBytes) + "B, " + fmt(c.replyBytes) + "B";
}

function podName(ip) {
  const p = nodeOf(ip);
  return p ? p.pod + " (" + ip + ")" : ip;
}

function drawFlows(body) {
  const fs = body.flows.slice().reverse();
  drops = fs.filter((f) => f.verdict === "dropped").slice(0, 5);
  const what = { drop: "✗ dropped", new: "✓ allowed", close: "✓ closed" };
  tableRows($("flows-table").tBodies[0], fs.length ? fs.map((f) => [
    { text: new Date(f.time).toLocaleTimeString(), attrs: { class: "num" } },
    { text: f.node },
    { text: what[f.event] || f.event, attrs: f.verdict === "dropped" ? { class: "bad", "data-verdict": "dropped" } : { "data-verdict": f.verdict } },
    { text: podName(f.src) + (f.srcPort ? ":" + f.srcPort : "") },
    { text: podName(f.dst) + (f.dstPort ? ":" + f.dstPort : "") + " " + f.proto },
    { text: f.verdict === "dropped" ? f.reason : (f.service ? "via Service " + f.service : "") + (f.masqueraded ? " masqueraded as " + f.masqueradedAs : ""), attrs: { "data-reason": "" } },
    { text: f.event === "close" ? (f.counts ? fmtBytes(f.counts) : "unknown") : "", attrs: { class: "num" } },
  ]) : [[{ text: "no flows yet" }, { text: "" }, { text: "" }, { text: "" }, { text: "" }, { text: "" }, { text: "" }]]);
  $("flows-status").textContent = body.errors.length ? "✗ " + body.errors.join("; ") : "✓ " + fs.length + " flows, updated " + new Date().toLocaleTimeString();
  $("flows-status").className = body.errors.length ? "bad" : "";
  if (prev) drawSVG(prev);
}

async function pollFlows() {
  try {
    const r = await fetch("api/flows");
    const body = await r.json();
    if (r.status === 404) { $("flows-status").textContent = body.error; return; }
    if (!r.ok) throw new Error(body.error || r.statusText);
    drawFlows(body);
  } catch (e) {
    $("flows-status").textContent = "✗ " + e.message;
    $("flows-status").className = "bad";
  }
  setTimeout(pollFlows, 2000);
}

function nodeText(n) {
  return n.name + " at " + n.underlay + ", lease " + (n.subnet || "none") + ", " + (n.dataplane || n.backend) +
    ", pods " + (n.pods.map((p) => p.name + " " + p.ip).join(", ") || "none") + ".";
}

function tableRows(tbody, rows) {
  tbody.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    for (const c of cells) {
      const td = el(c.th ? "th" : "td", Object.assign(c.th ? { scope: "row" } : {}, c.attrs || {}), c.text);
      tr.append(td);
    }
    return tr;
  }));
}

function drawTables(s) {
  tableRows($("nodes-table").tBodies[0], s.nodes.map((n) => {
    const r = rates[n.name], c = n.counters;
    const state = n.rejected ? "✗ lease rejected: " + n.rejected : n.error ? "✗ " + n.error :
      !n.observed ? "not observed (lease only)" : c && c.ready ? "✓ ready" : "✗ not ready";
    const peers = (n.peers || []).filter((p) => p.verdict !== "ok").map((p) => p.subnet + ": " + p.verdict);
    return [
      { th: true, text: n.name, attrs: { "data-node-row": n.name } },
      { text: n.underlay },
      { text: (n.subnet || "none") + (n.vtepMAC ? ", VTEP " + n.vtepMAC : "") + ", TTL " + n.leaseTTL },
      { text: n.backend + (n.dataplane ? " — " + n.dataplane : "") },
      { text: n.pods.map((p) => p.name + " " + p.ip + (p.veth ? " (" + p.veth + (n.bridge ? " on " + n.bridge : "") + ")" : "")).join(", ") || "–" },
      { text: r ? fmt(r.tx) + ", " + fmt(r.rx) : "–", attrs: { class: "num", "data-frames": n.name } },
      { text: r ? fmt(r.txB) + ", " + fmt(r.rxB) : "–", attrs: { class: "num", "data-bytes": n.name } },
      { text: c ? String(sum(c.repairs)) + (sum(c.repairs) ? " (" + Object.entries(c.repairs).filter(([, v]) => v).map(([k, v]) => k + " " + v).join(", ") + ")" : "") : "–", attrs: { class: "num", "data-repairs": n.name } },
      { text: state + (peers.length ? "; " + peers.join("; ") : ""), attrs: state.startsWith("✗") || peers.length ? { class: "bad" } : {} },
    ];
  }));
  tableRows($("links-table").tBodies[0], s.links.map((l) => {
    const ra = rates[l.a], rb = rates[l.b];
    const bad = l.state.some((x) => !x.endsWith(": ok"));
    return [
      { th: true, text: l.a + " ↔ " + l.b, attrs: { "data-link-row": l.id } },
      { text: l.kind + (s.encap ? " (" + s.encap + ")" : "") },
      { text: (bad ? "✗ " : "✓ ") + (l.state.join("; ") || "not observed"), attrs: bad ? { class: "bad" } : {} },
      { text: l.a + " " + (ra ? fmt(ra.tx) : "–") + ", " + l.b + " " + (rb ? fmt(rb.tx) : "–"), attrs: { class: "num" } },
    ];
  }));
  tableRows($("rejected-table").tBodies[0], s.rejected.length ? s.rejected.map((r) => [{ th: true, text: r.key + " (" + r.node + ")" }, { text: r.reason }]) : [[{ text: "none" }, { text: "" }]]);
}

function fillChoices(s) {
  const pods = s.nodes.flatMap((n) => n.pods.map((p) => ({ node: n.name, name: p.name, ip: p.ip })));
  const sig = pods.map((p) => p.name + p.ip).join();
  if ($("path-src").dataset.sig === sig) return;
  for (const id of ["path-src", "path-dst"]) {
    const sel = $(id), keep = sel.value;
    sel.replaceChildren(...pods.map((p) => el("option", { value: p.ip }, p.name + " (" + p.ip + ")")));
    if (id === "path-dst") sel.append(el("option", { value: "outside" }, "an outside address…"));
    if (keep) sel.value = keep;
    sel.dataset.sig = sig;
  }
  if (!$("path-dst").value || $("path-dst").value === $("path-src").value) $("path-dst").selectedIndex = Math.min(pods.length - 1, $("path-dst").options.length - 1);
}

function render(s) {
  rates = computeRates(s);
  events(s);
  prev = s;
  $("summary").textContent = "Leases from " + (s.source || "?") + " · network " + (s.network || "?") + " · " + (s.encap || "") +
    " · " + s.nodes.length + " nodes, " + s.nodes.reduce((a, n) => a + n.pods.length, 0) + " pods";
  $("status").textContent = (s.errors.length ? "✗ " + s.errors.join("; ") : "✓ live") + " · updated " + new Date(s.time).toLocaleTimeString();
  $("status").className = s.errors.length ? "bad" : "";
  drawSVG(s);
  drawTables(s);
  fillChoices(s);
}

function nodeOf(ip) {
  for (const n of (prev ? prev.nodes : [])) for (const p of n.pods) if (p.ip === ip) return { node: n.name, pod: p.name };
  return null;
}

async function showPath(ev) {
  ev.preventDefault();
  const src = $("path-src").value;
  const dst = $("path-dst").value === "outside" ? $("path-outside").value.trim() : $("path-dst").value;
  $("path-status").textContent = "Reading the path " + src + " → " + dst + "…";
  let body;
  try {
    const r = await fetch("api/path?src=" + encodeURIComponent(src) + "&dst=" + encodeURIComponent(dst));
    body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
  } catch (e) {
    $("path-status").textContent = "✗ " + e.message;
    $("path-status").className = "bad";
    return;
  }
  const a = nodeOf(src), b = nodeOf(dst);
  chosen = { srcNode: a && a.node, dstNode: b && b.node, srcPod: a && a.pod, dstPod: b && b.pod };
  $("path-status").className = body.problems ? "bad" : "";
  $("path-status").textContent = (body.problems ? "✗ " + body.problems + " problem(s) on the path" : "✓ every hop matches the leases") + " (read on " + body.readOn + ")";
  $("path-caption").textContent = body.src + " → " + body.dst + ", " + body.hops.length + " hops";
  tableRows($("path-table").tBodies[0], body.hops.map((h, i) => [
    { text: String(i + 1), attrs: { class: "num" } },
    { th: true, text: h.step, attrs: { "data-step": h.step, "data-explain": h.explain ? "1" : "0" } },
    { text: h.object },
    { text: h.detail + (h.problem ? " ✗ " + h.problem : ""), attrs: Object.assign({ "data-detail": "" }, h.problem ? { class: "bad" } : {}) },
  ]));
  for (const [i, tr] of [...$("path-table").tBodies[0].rows].entries()) {
    const o = el("span", { class: "object" }, "(" + body.hops[i].object + ")");
    tr.cells[3].append(" ", o);
  }
  $("path-table").hidden = false;
  $("path-explain").textContent = body.explain;
  $("path-explain-box").hidden = false;
  if (prev) drawSVG(prev);
}

function connect() {
  const es = new EventSource("api/events");
  es.addEventListener("snapshot", (e) => render(JSON.parse(e.data)));
  es.onerror = () => { $("status").textContent = "✗ disconnected, retrying…"; $("status").className = "bad"; };
}

document.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("resize", () => { if (prev) drawSVG(prev); });
  $("path-form").addEventListener("submit", showPath);
  $("path-dst").addEventListener("change", () => { $("outside-label").hidden = $("path-dst").value !== "outside"; });
  connect();
  pollFlows();
});
