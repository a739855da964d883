// The run page: history from the JSON endpoint (downsampled on the server), then live points over the websocket.
// The socket opens first and buffers; the history fetch names the last step held, so nothing falls in between,
// and a reconnect fetches only what it missed. Smoothing and the x axis are the browser's business.
// The per-domain series (reward/<domain> ...) are neither fetched nor sent here: run_domains.js reads a page of them
// from the domains endpoint when a step says it wrote some ("studio:step" on #run-live).
(function () {
  "use strict";
  const root = document.getElementById("run-live");
  if (!root) return;
  const urls = JSON.parse(document.getElementById("run-urls").textContent);
  const rules = JSON.parse(document.getElementById("run-panel-rules").textContent);
  const initialPanels = JSON.parse(document.getElementById("run-panels").textContent);
  const perDomain = JSON.parse(document.getElementById("run-per-domain").textContent);
  const COLOURS = ["#2f5bd3", "#d9672b", "#2e9b46", "#a23fb5", "#c99a16", "#1a9bb0", "#c03434", "#6b7486", "#7a5c2e"];
  const runId = root.dataset.run;

  const series = {}; // name -> {step: [], wall_time: [], value: []}
  const panels = {}; // key -> {div, figure, names: []}
  const dirty = new Set();
  // lastStep: the newest step held, null before any (step 0, the start-of-run evaluation, is a step to fetch).
  let lastStep = null, lastEventId = 0, xKey = "step", smoothing = 0.6, pendingSteps = [];
  // What the benchmark and the tests read: when each step became visible (ms since the epoch).
  const live = window.studioLive = { run: runId, rendered: [], received: [], connected: false,
    reconnects: 0 };

  function isPerDomain(name) {
    return !perDomain.overall.includes(name) && perDomain.prefixes.some(p => name.startsWith(p));
  }
  function panelKeyFor(name) {
    for (const rule of rules) {
      if ((rule.exclude || []).includes(name)) continue;
      if ((rule.names || []).includes(name) || (rule.prefixes || []).some(p => name.startsWith(p))) return rule.key;
    }
    return "ns-" + name.split("/")[0];
  }
  function ruleOf(key) { return rules.find(r => r.key === key) || { stacked: false, secondary: [] }; }
  function label(name) { return name.includes("/") ? name.split("/").slice(1).join("/").replace(/_/g, " ") : name; }

  function addPanel(key, figure) {
    const box = document.createElement("div");
    box.className = "panel";
    const div = document.createElement("div");
    div.dataset.panel = key;
    const legend = document.createElement("div");
    legend.className = "legend";
    box.append(div, legend);
    document.getElementById("panels").appendChild(box);
    document.getElementById("no-metrics").hidden = true;
    figure.layout.showlegend = false;
    panels[key] = { div, legend, figure, names: figure.data.map(t => t.meta), visible: false };
    Plotly.newPlot(div, figure.data, figure.layout, { displaylogo: false, responsive: true });
    drawLegend(panels[key]);
    watcher.observe(div);
  }

  // Legends are HTML beside the chart, drawn when a series is added, not on every redraw.
  function drawLegend(panel) {
    panel.legend.replaceChildren(...panel.figure.data.map(trace => {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = (trace.line && trace.line.color) || "#888";
      item.append(swatch, document.createTextNode(trace.name));
      return item;
    }));
  }

  // A panel out of view is not redrawn (Plotly takes 10-15 ms a chart however few its points; with ten run
  // pages open that was most of a 2-core machine); it is drawn as it scrolls into view.
  const watcher = new IntersectionObserver(entries => {
    for (const entry of entries) {
      const panel = panels[entry.target.dataset.panel];
      if (!panel) continue;
      panel.visible = entry.isIntersecting;
      if (panel.visible && dirty.has(entry.target.dataset.panel)) schedule();
    }
  }, { rootMargin: "0px" });

  function ensureSeries(name) {
    if (series[name]) return;
    series[name] = { step: [], wall_time: [], value: [] };
    const key = panelKeyFor(name);
    if (!panels[key]) {
      // A namespace the page had no panel for: borrow the first panel's look.
      const template = initialPanels.length ? JSON.parse(initialPanels[0].figure).layout : {};
      const layout = Object.assign({}, template, { title: { text: key.replace(/^ns-/, ""), x: 0.01 } });
      delete layout.yaxis2;
      layout.yaxis = { title: { text: "" } };
      addPanel(key, { data: [], layout });
    }
    const panel = panels[key];
    if (!panel.names.includes(name)) {
      const rule = ruleOf(key);
      const trace = { x: [], y: [], name: label(name), meta: name, mode: "lines", type: "scatter",
        line: { color: COLOURS[panel.names.length % COLOURS.length], width: name === "reward/mean" ? 2.5 : 1.6 } };
      if (rule.stacked) trace.stackgroup = "idle";
      if ((rule.secondary || []).includes(name)) trace.yaxis = "y2";
      panel.figure.data.push(trace);
      panel.names.push(name);
      drawLegend(panel);
    }
    dirty.add(key);
  }

  function append(name, step, wallTime, value) {
    if (isPerDomain(name)) return; // the domains' heatmap and table have them (run_domains.js)
    ensureSeries(name);
    const s = series[name];
    const n = s.step.length;
    if (n && step <= s.step[n - 1]) {
      if (step === s.step[n - 1]) s.value[n - 1] = value; // a replayed step overwrites
      return;
    }
    s.step.push(step); s.wall_time.push(wallTime); s.value.push(value);
    dirty.add(panelKeyFor(name));
  }

  function smooth(values) { return window.studioSmooth(values, smoothing); }  // smoothing.js

  let frame = null;
  function schedule() { if (!frame) frame = requestAnimationFrame(render); }
  function render() {
    frame = null;
    const began = performance.now();
    const steps = pendingSteps; pendingSteps = [];
    const jobs = [];
    for (const key of Array.from(dirty)) {
      const panel = panels[key];
      if (!panel) { dirty.delete(key); continue; }
      if (!panel.visible) continue;
      dirty.delete(key);
      const data = panel.figure.data.map(trace => {
        const s = series[trace.meta] || { step: [], wall_time: [], value: [] };
        const x = xKey === "step" ? s.step : s.wall_time.map(t => new Date(t * 1000));
        // A lone point (a run's first step, a one-step reference check) is a line of nothing: draw it as a dot.
        return Object.assign({}, trace, { x, y: smooth(s.value), mode: x.length === 1 ? "markers" : trace.mode });
      });
      const layout = Object.assign({}, panel.figure.layout);
      layout.xaxis = Object.assign({}, layout.xaxis || {}, { type: xKey === "step" ? "linear" : "date" });
      jobs.push(Plotly.react(panel.div, data, layout));
    }
    root.dataset.lastStep = String(lastStep);
    Promise.all(jobs).then(() => {
      const at = Date.now(), ms = performance.now() - began;
      for (const step of steps) live.rendered.push({ step, at, ms, panels: jobs.length });
    });
  }

  // The dot beside the status: is this page getting the run's updates as they happen? Only a queued or running
  // run (ACTIVE_STATUSES, apps/runs/models.py, written into the page) writes more; a paused or interrupted one may
  // be resumed, so the socket stays open, but neither it nor an ended one is live.
  const ACTIVE = root.dataset.activeStatuses.split(" ");
  const state = root.querySelector("[data-live-state]");
  let link = "connecting"; // the socket's state: connecting, live, reconnecting
  function showLiveState() {
    const status = root.dataset.status;
    if (!ACTIVE.includes(status)) {
      state.textContent = status === "paused" || status === "interrupted" ? status : "ended";
      state.className = "live-state ended";
      state.title = "no live updates: the run is " + status;
    } else {
      state.textContent = link === "live" ? "live" : link + "…";
      state.className = "live-state" + (link === "live" ? " on" : link === "reconnecting" ? " off" : "");
      state.title = "live updates";
    }
  }

  function setStatus(status, step, steps) {
    root.dataset.status = status;
    showLiveState();
    root.querySelectorAll("[data-status]").forEach(el => {
      if (el.classList.contains("badge")) { el.textContent = status; el.className = "badge status-" + status; }
    });
    if (step !== undefined) {
      root.querySelector("[data-step]").textContent = step;
      const progress = root.querySelector("[data-progress]"); // a run trained elsewhere has no bar: no known end
      if (progress) progress.value = step;
    }
    root.querySelectorAll("[data-when]").forEach(b => { b.hidden = !b.dataset.when.split(" ").includes(status); });
  }

  function addEvent(event) {
    if (event.id && event.id <= lastEventId) return;
    if (event.id) lastEventId = event.id;
    const li = document.createElement("li");
    li.className = "event kind-" + event.kind;
    const when = event.created_at ? new Date(event.created_at).toLocaleTimeString() : "";
    li.innerHTML = '<span class="badge"></span> <span class="message"></span> <span class="muted"></span>';
    li.children[0].textContent = event.kind.replace(/_/g, " ");
    li.children[1].textContent = event.message;
    li.children[2].textContent = (event.step != null ? "step " + event.step + " · " : "") + when;
    const list = document.getElementById("events");
    list.insertBefore(li, list.firstChild);
    while (list.children.length > 300) list.removeChild(list.lastChild);
  }

  function hold(step) { lastStep = lastStep === null ? step : Math.max(lastStep, step); }

  function applyHistory(body) {
    const reconnected = lastStep !== null;
    for (const [name, s] of Object.entries(body.series)) {
      for (let i = 0; i < s.step.length; i++) append(name, s.step[i], s.wall_time[i], s.value[i]);
    }
    if (body.last_step !== null) hold(body.last_step);
    body.events.forEach(addEvent);
    setStatus(body.run.status, body.run.step);
    const bucket = root.parentNode.querySelector("[data-bucket]");
    if (bucket && body.bucket > 1) bucket.textContent = "history averaged over " + body.bucket + " steps a point";
    // After a reconnect the domains may have moved while the page had no socket: run_domains.js reads them again.
    if (reconnected) root.dispatchEvent(new CustomEvent("studio:step", { detail: { step: lastStep, domains: 1 } }));
  }

  function handle(message) {
    if (message.type === "run.step") {
      live.received.push({ step: message.step, at: Date.now() });
      for (const [name, value] of Object.entries(message.points)) append(name, message.step, message.wall_time, value);
      hold(message.step);
      root.dispatchEvent(new CustomEvent("studio:step", { detail: { step: message.step, domains: message.domains || 0 } }));
      setStatus(root.dataset.status, lastStep);
      pendingSteps.push(message.step);
    } else if (message.type === "run.event") {
      addEvent(message.event);
    } else if (message.type === "run.status") {
      setStatus(message.status, message.step);
    }
    schedule();
  }

  let backoff = 500, socket = null;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + urls.ws);
    let buffer = [];
    socket.onopen = () => {
      link = "live"; showLiveState();
      const query = "?per_domain=0&" + (lastStep === null ? "" : "after_step=" + lastStep + "&") + "after_event=" + lastEventId;
      fetch(urls.history + query, { credentials: "same-origin" })
        .then(r => { if (!r.ok) throw new Error(r.status); return r.json(); })
        .then(body => {
          applyHistory(body);
          const held = buffer; buffer = null;
          held.forEach(handle);
          live.connected = true;
          backoff = 500;
          schedule();
        })
        .catch(() => socket.close());
    };
    socket.onmessage = (e) => {
      const message = JSON.parse(e.data);
      if (buffer) buffer.push(message); else handle(message);
    };
    socket.onclose = () => {
      live.connected = false;
      link = "reconnecting"; showLiveState();
      live.reconnects += 1;
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 10000);
    };
  }
  // Testing hook: drop the socket as a network blip would (the page reconnects and catches up).
  live.dropSocket = () => socket && socket.close();

  document.querySelector("[data-x-axis]").addEventListener("change", e => {
    xKey = e.target.value; Object.keys(panels).forEach(k => dirty.add(k)); schedule();
  });
  const slider = document.querySelector("[data-smoothing]");
  slider.addEventListener("input", e => {
    smoothing = parseFloat(e.target.value);
    document.querySelector("[data-smoothing-value]").textContent = smoothing.toFixed(2);
    Object.keys(panels).forEach(k => dirty.add(k)); schedule();
  });
  smoothing = parseFloat(slider.value);

  initialPanels.forEach(p => addPanel(p.key, JSON.parse(p.figure)));
  Object.values(panels).forEach(p => p.names.forEach(n => { series[n] = series[n] || { step: [], wall_time: [], value: [] }; }));
  setStatus(root.dataset.status);
  connect();
})();
