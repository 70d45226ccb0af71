// elastic-ring cluster page: polls /api/state every second and redraws. Read-only.
// Every text from the cluster goes in through textContent (never innerHTML), so a job named
// <script>...</script> shows as text.
"use strict";
const SVGNS = "http://www.w3.org/2000/svg";
const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"];
const color = id => COLORS[(id - 1) % COLORS.length];

function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function svgTitle(node, text) { node.appendChild(el("svg:title", {}, text)); return node; }
function dur(s) {
  if (s === null || s === undefined || !isFinite(s)) return "-";
  s = Math.max(0, s);
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
}
function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }

function drawJobs(st) {
  const body = document.querySelector("#jobs tbody");
  const rows = [];
  for (const j of st.jobs) {
    const tr = el("tr", {"class": "job st-" + j.state, "data-job": String(j.id), "data-state": j.state});
    const cells = [
      [String(j.id)], [j.name, "name"], [j.run_state ? j.state + " (" + j.run_state + ")" : j.state, "state"], [String(j.workers)],
      [j.step + " / " + (j.total || "?")], [j.state === "running" ? j.images_per_s.toFixed(1) : "-"],
      [dur(j.remaining_s)], [dur(j.jct_s)], [String(j.restarts)],
      [j.resizes + (j.resizes ? " (" + dur(j.resize_lost_s) + ")" : "")],
    ];
    for (const [text, cls] of cells) tr.appendChild(el("td", cls ? {"class": cls} : {}, text));
    if (j.last_change) tr.querySelector("td.state").title = "last change: " + j.last_change;
    if (j.state === "failed" && (j.message || j.log)) {  // why, and where the whole story is
      const why = el("div", {"class": "why"});
      if (j.message) why.appendChild(el("div", {"class": "reason"}, j.message));
      if (j.log) why.appendChild(el("div", {"class": "log"}, "log: " + j.log));
      tr.querySelector("td.state").appendChild(why);
    }
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

function drawTimeline(st) {
  const svg = document.getElementById("timeline");
  const jobs = st.jobs.filter(j => st.timeline.some(b => b.job_id === j.id));
  const W = 960, left = 150, right = 10, rowH = 34, top = 8, axisH = 22, decH = 16;
  const H = top + decH + Math.max(1, jobs.length) * rowH + axisH;
  svg.setAttribute("height", H);
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  const nodes = [];
  const t0 = Math.min(st.now - 10, ...st.timeline.map(b => b.from), ...st.jobs.map(j => j.submitted));
  const t1 = st.now;
  const x = t => left + (W - left - right) * (t - t0) / Math.max(1e-9, t1 - t0);
  const maxSlots = Math.max(1, st.cluster.slots);
  // decisions row
  nodes.push(el("svg:text", {x: 4, y: top + 12, "class": "lbl"}, "decisions"));
  for (const d of st.decisions) {
    const cx = x(d.time);
    const alloc = Object.entries(d.allocation).map(([k, v]) => "job " + k + ": " + v).join(", ");
    nodes.push(svgTitle(el("svg:path", {d: `M${cx - 5},${top + 14} L${cx + 5},${top + 14} L${cx},${top + 4} Z`,
      fill: "#888", "class": "decision"}), clock(d.time) + " decision (" + d.cause +
      (d.job_id !== null ? ", job " + d.job_id : "") + "): " + (alloc || "nothing")));
  }
  // scheduler gaps
  for (const g of st.scheduler.gaps) {
    const a = x(g.from), b = x(g.to === null ? st.now : g.to);
    nodes.push(svgTitle(el("svg:rect", {x: a, y: top, width: Math.max(1, b - a), height: H - top - axisH,
      fill: "#cf222e", opacity: 0.08, "class": "gap"}), "scheduler not running " + clock(g.from) +
      (g.to === null ? " - now" : " - " + clock(g.to))));
  }
  jobs.forEach((j, i) => {
    const y0 = top + decH + i * rowH;
    const label = "#" + j.id + " " + j.name;
    nodes.push(svgTitle(el("svg:text", {x: 4, y: y0 + rowH / 2 + 4}, label.length > 17 ? label.slice(0, 16) + "\u2026" : label), label));
    nodes.push(el("svg:line", {x1: left, x2: W - right, y1: y0 + rowH - 2, y2: y0 + rowH - 2, stroke: "#eee"}));
    for (const b of st.timeline.filter(b => b.job_id === j.id)) {
      const h = (rowH - 6) * b.slots / maxSlots;
      const a = x(b.from), e = x(b.to === null ? st.now : b.to);
      nodes.push(svgTitle(el("svg:rect", {x: a, y: y0 + rowH - 2 - h, width: Math.max(1, e - a), height: h,
        fill: color(j.id), "class": "bar", "data-job": String(j.id), "data-slots": String(b.slots)}),
        "job " + j.id + " (" + j.name + "): " + b.slots + " slot(s), " + clock(b.from) + " - " +
        (b.to === null ? "now" : clock(b.to))));
    }
    for (const r of j.resize_events) {
      const cx = x(r.time), cy = y0 + 8;
      nodes.push(svgTitle(el("svg:path", {d: `M${cx},${cy - 6} L${cx + 6},${cy} L${cx},${cy + 6} L${cx - 6},${cy} Z`,
        fill: "#222", "class": "resize"}), "resize " + r.from_workers + " -> " + r.to_workers + " at step " +
        r.step + ": " + dur(r.total_lost_s) + " lost (stop " + dur(r.stop_latency_s) + ", checkpoint " +
        dur(r.checkpoint_s) + ", relaunch to first step " + dur(r.relaunch_to_first_step_s) + ")"));
    }
    for (const r of j.restart_events) {
      const cx = x(r.time), cy = y0 + 8;
      nodes.push(svgTitle(el("svg:text", {x: cx - 5, y: cy + 5, fill: "#cf222e", "class": "restart"}, "\u2716"),
        "restart " + r.attempt + " (" + r.cause + "), " + r.steps_redone + " step(s) redone" +
        (r.gave_up ? ", gave up" : "")));
    }
  });
  const ya = H - axisH + 14;
  nodes.push(el("svg:text", {x: left, y: ya}, clock(t0)));
  nodes.push(el("svg:text", {x: W - right - 70, y: ya}, clock(t1)));
  svg.replaceChildren(...nodes);
}

function lineChart(points, label, col) {
  const W = 300, H = 120, pad = 32;
  const svg = el("svg:svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, "class": "chart"});
  if (points.length === 0) { svg.appendChild(el("svg:text", {x: 10, y: 60}, "no data yet")); return svg; }
  const ts = points.map(p => p[0]), vs = points.map(p => p[1]);
  const ta = Math.min(...ts), tb = Math.max(...ts, ta + 1e-9);
  const va = Math.min(...vs), vb = Math.max(...vs, va + 1e-9);
  const x = t => pad + (W - pad - 6) * (t - ta) / (tb - ta);
  const y = v => H - 16 - (H - 26) * (v - va) / (vb - va);
  svg.appendChild(el("svg:polyline", {points: points.map(p => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" "),
    fill: "none", stroke: col, "stroke-width": 1.5}));
  svg.appendChild(el("svg:text", {x: 2, y: 12}, vb.toPrecision(3)));
  svg.appendChild(el("svg:text", {x: 2, y: H - 18}, va.toPrecision(3)));
  svg.appendChild(el("svg:text", {x: pad, y: H - 2}, dur(tb - ta) + " of " + label));
  return svg;
}

function drawCurves(st) {
  const box = document.getElementById("curves");
  const items = [];
  for (const j of st.jobs) {
    if (!j.curves.loss.length) continue;
    for (const [key, label] of [["loss", "loss"], ["images_per_s", "images/s"]]) {
      const d = el("div", {"class": "curve", "data-job": String(j.id)});
      d.appendChild(el("h3", {}, "#" + j.id + " " + j.name + ": " + label));
      d.appendChild(lineChart(j.curves[key], label, color(j.id)));
      items.push(d);
    }
  }
  box.replaceChildren(...items);
}

const HOST_STATE = {in_use: "in use", idle: "discovered, idle", excluded: "excluded", draining: "draining"};

function drawHosts(st) {
  const rows = [];
  for (const j of st.jobs) {
    for (const h of j.hosts || []) {
      const tr = el("tr", {"class": "host hs-" + h.state, "data-host-job": String(j.id), "data-host": h.host,
                           "data-host-state": h.state});
      const slots = h.state === "in_use" && h.in_use_slots !== h.slots ? h.in_use_slots + " of " + h.slots : String(h.slots);
      for (const [text, cls] of [["#" + j.id + " " + j.name, "name"], [h.host, "name"], [slots],
                                 [HOST_STATE[h.state] || h.state, "state"],
                                 [h.until === null ? "-" : clock(h.until)]]) {
        tr.appendChild(el("td", cls ? {"class": cls} : {}, text));
      }
      rows.push(tr);
    }
  }
  document.querySelector("#hosts tbody").replaceChildren(...rows);
  document.getElementById("hosts-section").hidden = rows.length === 0;
}

function draw(st) {
  const counts = {};
  for (const j of st.jobs) counts[j.state] = (counts[j.state] || 0) + 1;
  document.getElementById("summary").textContent = st.cluster.slots + " slot(s) (" + st.slots_used +
    " in use), policy " + st.cluster.policy + ", " + st.jobs.length + " job(s): " +
    Object.entries(counts).map(([k, v]) => v + " " + k).join(", ");
  const sch = document.getElementById("scheduler");
  sch.textContent = st.scheduler.alive ? "scheduler running (pid " + st.scheduler.pid + ")"
    : "scheduler not running" + (st.cluster.down_requested ? " (cluster down)" : "");
  sch.className = st.scheduler.alive ? "up" : "down";
  drawJobs(st);
  drawHosts(st);
  drawTimeline(st);
  drawCurves(st);
  document.getElementById("updated").textContent = clock(st.now);
}

async function poll() {
  try {
    const r = await fetch("api/state", {cache: "no-store"});
    if (r.ok) draw(await r.json());
  } catch (e) {
    document.getElementById("updated").textContent = "failed (" + e + "), retrying";
  }
  setTimeout(poll, 1000);
}
poll();
