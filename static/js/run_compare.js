// Compare runs: each run's history (downsampled on the server) for the chosen metrics, one trace per run.
(function () {
  "use strict";
  const figuresNode = document.getElementById("compare-figures");
  if (!figuresNode) return;
  const figures = JSON.parse(figuresNode.textContent).map(f => ({ name: f.name, figure: JSON.parse(f.figure) }));
  const runs = JSON.parse(document.getElementById("compare-runs").textContent);
  const container = document.getElementById("compare-panels");
  const slider = document.querySelector("[data-smoothing]");
  const data = {}; // run id -> series
  const divs = figures.map(f => {
    const div = document.createElement("div");
    div.className = "panel";
    div.dataset.metric = f.name;
    container.appendChild(div);
    Plotly.newPlot(div, f.figure.data, f.figure.layout, { displaylogo: false, responsive: true });
    return div;
  });

  function render() {
    const s = parseFloat(slider.value);
    figures.forEach((f, i) => {
      const traces = f.figure.data.map(trace => {
        const series = (data[trace.meta] || {})[f.name] || { step: [], value: [] };
        // A one-step run (a reference check) is a dot, not an invisible line of one point.
        return Object.assign({}, trace, { x: series.step, y: window.studioSmooth(series.value, s),
          mode: series.step.length === 1 ? "markers" : trace.mode });
      });
      Plotly.react(divs[i], traces, f.figure.layout);
    });
    document.body.dataset.compareLoaded = String(Object.keys(data).length);
  }
  const names = figures.map(f => "name=" + encodeURIComponent(f.name)).join("&");
  Promise.all(runs.map(run => fetch(run.history + "?" + names, { credentials: "same-origin" })
    .then(r => r.json()).then(body => { data[run.id] = body.series; }))).then(render);
  slider.addEventListener("input", render);
})();
