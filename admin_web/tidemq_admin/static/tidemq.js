// Small conveniences only: every page works without this file.
document.addEventListener("DOMContentLoaded", function () {
  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll('input[name="ids"]').forEach(function (box) { box.checked = all.checked; });
    });
  }
  // A dashboard keeps its figures current: it asks for the page again and swaps in the new
  // #live part, without a reload (scroll position and anything typed elsewhere stay).
  var live = document.getElementById("live");
  if (live && live.dataset.refresh && window.fetch && window.DOMParser) {
    var every = Math.max(1, parseInt(live.dataset.refresh, 10)) * 1000;
    window.setInterval(function () {
      if (document.hidden) { return; }
      fetch(window.location.href, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}})
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (!html) { return; }
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
          var current = document.getElementById("live");
          if (fresh && current) { current.innerHTML = fresh.innerHTML; }
        })
        .catch(function () { /* the next tick tries again */ });
    }, every);
  }
  document.querySelectorAll("[data-confirm]").forEach(function (button) {
    button.addEventListener("click", function (event) {
      if (!window.confirm(button.getAttribute("data-confirm"))) { event.preventDefault(); }
    });
  });
});
