// Trajectory replay: step through the turns with the keyboard (j/k or arrows), jump between trajectories ([ ]),
// colour the model's tokens by advantage or logprob (c), jump to the verdict (v). The URL's #turn-N is the
// permalink of the turn in view; on a side-by-side page both trajectories step together.
(function () {
  "use strict";
  const replays = Array.from(document.querySelectorAll("[data-replay]"));
  if (!replays.length) return;
  let current = 0;

  function maxSteps() { return Math.max(...replays.map(r => r.querySelectorAll(".turn").length)); }

  function show(index, scroll) {
    current = Math.max(0, Math.min(index, maxSteps() - 1));
    for (const replay of replays) {
      const turns = replay.querySelectorAll(".turn");
      turns.forEach(t => t.classList.remove("current"));
      const turn = turns[Math.min(current, turns.length - 1)];
      if (!turn) continue;
      turn.classList.add("current");
      if (scroll) turn.scrollIntoView({ block: "nearest", behavior: "instant" });
    }
    history.replaceState(null, "", "#turn-" + current);
    document.body.dataset.currentTurn = String(current);
  }

  function colour(mode) {
    for (const replay of replays) {
      replay.dataset.colour = mode;
    }
    document.querySelectorAll("[data-colour-mode]").forEach(s => { s.value = mode; });
  }

  for (const replay of replays) {
    const advantage = parseFloat(replay.dataset.advantage);
    if (!isNaN(advantage)) {
      const strength = Math.min(1, Math.abs(advantage)) * 0.55 + 0.08;
      replay.style.setProperty("--adv-bg", advantage >= 0 ? `rgba(46,155,70,${strength})` : `rgba(192,52,52,${strength})`);
    }
    replay.querySelectorAll(".tok").forEach(tok => {
      const lp = parseFloat(tok.dataset.lp);
      if (isNaN(lp)) return;
      // Unlikely tokens stand out: red by how improbable the sampled token was.
      tok.style.setProperty("--lp-bg", `rgba(192,52,52,${(1 - Math.exp(lp)) * 0.75})`);
    });
    const script = replay.querySelector('script[type="application/json"]');
    const div = replay.querySelector(".timeline");
    if (script && div && window.Plotly) {
      const figure = JSON.parse(JSON.parse(script.textContent));
      Plotly.newPlot(div, figure.data, figure.layout, { displaylogo: false, responsive: true });
    }
    replay.querySelectorAll(".turn").forEach(turn => {
      turn.addEventListener("click", () => show(parseInt(turn.dataset.step, 10), false));
    });
  }

  function go(name) {
    const link = document.querySelector(`[data-nav="${name}"]`);
    if (link) location.href = link.href + location.hash;
  }

  document.addEventListener("keydown", e => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement && document.activeElement.tagName)) return;
    const key = e.key;
    if (key === "j" || key === "ArrowDown" || key === "ArrowRight") { show(current + 1, true); e.preventDefault(); }
    else if (key === "k" || key === "ArrowUp" || key === "ArrowLeft") { show(current - 1, true); e.preventDefault(); }
    else if (key === "[") go("previous");
    else if (key === "]") go("next");
    else if (key === "c") {
      const modes = ["advantage", "logprob", "none"];
      colour(modes[(modes.indexOf(replays[0].dataset.colour) + 1) % modes.length]);
    } else if (key === "v") {
      const verdict = replays[0].querySelector("[data-verdict]");
      if (verdict) verdict.scrollIntoView({ block: "start" });
    }
  });
  document.querySelectorAll("[data-step-next]").forEach(b => b.addEventListener("click", () => show(current + 1, true)));
  document.querySelectorAll("[data-step-prev]").forEach(b => b.addEventListener("click", () => show(current - 1, true)));
  document.querySelectorAll("[data-colour-mode]").forEach(s => s.addEventListener("change", () => colour(s.value)));
  document.querySelectorAll("[data-copy-permalink]").forEach(b => b.addEventListener("click", () => {
    const url = location.href;
    (navigator.clipboard ? navigator.clipboard.writeText(url) : Promise.reject()).then(
      () => { b.textContent = "Copied"; }, () => { window.prompt("Permalink", url); });
  }));

  document.addEventListener("replay:goto", e => show(e.detail, true));
  const match = /^#turn-(\d+)$/.exec(location.hash);
  show(match ? parseInt(match[1], 10) : 0, !!match);
  colour("advantage");
})();
window.addEventListener("hashchange", () => {
  const match = /^#turn-(\d+)$/.exec(location.hash);
  if (match) document.dispatchEvent(new CustomEvent("replay:goto", { detail: parseInt(match[1], 10) }));
});
