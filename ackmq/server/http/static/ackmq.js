// ackmq web UI: live refresh and confirmations. Our own few lines, no library.
// Every N seconds the page is fetched again (same URL, same credentials) and its #live
// part replaces ours; forms outside #live keep what is being typed.
(function () {
  "use strict";
  function refresh() {
    var live = document.getElementById("live");
    if (!live || document.hidden) { return; }
    var url = window.location.pathname + window.location.search.replace(/([?&])(msg|err)=[^&]*/g, "$1");
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.redirected && new URL(r.url).pathname === "/login") {
          window.location.assign(r.url);  // the session ended: to the login form
          return null;
        }
        return r.ok ? r.text() : null;
      })
      .then(function (text) {
        if (!text) { return; }
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("live");
        if (fresh) {
          live.innerHTML = fresh.innerHTML;
          live.setAttribute("data-updated", String(Date.now()));
          bind(live);
        }
      })
      .catch(function () { /* the broker may be restarting: try again next tick */ });
  }
  function bind(root) {
    root.querySelectorAll("form[data-confirm]").forEach(function (f) {
      if (f.dataset.bound) { return; }
      f.dataset.bound = "1";
      f.addEventListener("submit", function (ev) {
        if (!window.confirm(f.getAttribute("data-confirm"))) { ev.preventDefault(); }
      });
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    bind(document);
    var live = document.getElementById("live");
    var every = live ? parseFloat(live.getAttribute("data-refresh") || "5") : 5;
    window.ackmqRefresh = refresh;
    setInterval(refresh, every * 1000);
  });
})();
