// The playgrounds' forms run a check or a reference in a sandbox, which takes seconds (a minute while a training run
// holds the CPUs): from the moment one is sent until its answer arrives, the form says what it is doing and counts
// the seconds, and a second click sends nothing more.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("form[data-running]").forEach((form) => {
    const note = form.querySelector("[data-running-note]");
    let started = null;
    let timer = null;
    const show = () => {
      note.textContent = `${form.dataset.running}… ${Math.floor((Date.now() - started) / 1000)} s`;
    };
    form.addEventListener("submit", (event) => {
      if (started !== null) {
        event.preventDefault();  // already under way
        return;
      }
      started = Date.now();
      form.setAttribute("aria-busy", "true");
      show();
      note.hidden = false;
      timer = setInterval(show, 1000);
    });
    // Back to this page from the answer (the browser's back/forward cache): nothing is under way any more.
    window.addEventListener("pageshow", (event) => {
      if (!event.persisted) return;
      clearInterval(timer);
      started = null;
      note.hidden = true;
      form.removeAttribute("aria-busy");
    });
  });
});
