// The suite page: the timeline the server built (apps/evals/figures.py), drawn once; and the leaderboard sorted
// by a column when its header is clicked (again: the other way round).
document.addEventListener("DOMContentLoaded", () => {
  const node = document.getElementById("eval-timeline-figure");
  if (node && typeof Plotly !== "undefined") {
    const figure = JSON.parse(node.textContent);
    Plotly.newPlot("eval-timeline", figure.data, figure.layout, { displaylogo: false, responsive: true });
  }
  const table = document.querySelector("table[data-leaderboard]");
  if (!table) return;
  table.querySelectorAll("th[data-sort]").forEach((header) => {
    header.style.cursor = "pointer";
    header.addEventListener("click", () => {
      const column = [...header.parentNode.children].indexOf(header);
      const numeric = header.dataset.sort === "number";
      const descending = header.dataset.order !== "desc";
      header.dataset.order = descending ? "desc" : "asc";
      const body = table.tBodies[0];
      const rows = [...body.rows].filter((row) => row.cells.length > column);
      const key = (row) => {
        const cell = row.cells[column];
        return numeric ? parseFloat(cell.dataset.value ?? cell.textContent) : cell.textContent.trim();
      };
      rows.sort((a, b) => {
        const [x, y] = [key(a), key(b)];
        const order = numeric ? x - y : String(x).localeCompare(String(y));
        return descending ? -order : order;
      });
      rows.forEach((row) => body.appendChild(row));
    });
  });
});
