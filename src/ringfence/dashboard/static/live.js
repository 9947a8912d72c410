// Live updates without a framework: every few seconds the page's <main> is fetched again and swapped in,
// unless the user is typing or has selected something. A bulk action's next batch is submitted by itself.
(function () {
  "use strict";
  var body = document.body;
  var every = parseFloat(body.getAttribute("data-refresh") || "5") * 1000;
  var page = body.getAttribute("data-page");
  var next = document.querySelector("form[data-autosubmit]");
  if (next) { setTimeout(function () { next.submit(); }, 200); return; }
  if (!every || page === "login" || page === "progress" || page === "reconcile") return;
  function busy(main) {
    var a = document.activeElement;
    if (a && main.contains(a) && /INPUT|SELECT|TEXTAREA/.test(a.tagName)) return true;
    return !!main.querySelector("input[type=checkbox]:checked");
  }
  setInterval(function () {
    var main = document.getElementById("live");
    if (!main || document.hidden || busy(main)) return;
    fetch(location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null && !busy(main)) { main.innerHTML = html; } })
      .catch(function () { /* offline for a moment: the next tick tries again */ });
  }, every);
})();
