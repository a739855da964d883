// The suite page's timeline: the figure the server built (apps/evals/figures.py), drawn once.
document.addEventListener("DOMContentLoaded", () => {
  const node = document.getElementById("eval-timeline-figure");
  if (!node || typeof Plotly === "undefined") return;
  const figure = JSON.parse(node.textContent);
  Plotly.newPlot("eval-timeline", figure.data, figure.layout, { displaylogo: false, responsive: true });
});
