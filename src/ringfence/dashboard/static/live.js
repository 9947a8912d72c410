// Live updates without a framework: every few seconds the page's <main> is fetched again and swapped in,
// unless the user is typing or has selected something. A bulk action's next batch is submitted by itself.
(function () {
  "use strict";
  // A copy button copies its target's text as shown (redacted); delegated: refreshed content keeps working.
  document.addEventListener("click", function (e) {
    var b = e.target.closest && e.target.closest("button[data-copy]");
    if (!b) return;
    var text = (document.getElementById(b.getAttribute("data-copy")) || {}).textContent || "";
    function done() { b.textContent = "Copied"; b.setAttribute("data-copied", "1"); }
    if (navigator.clipboard && window.isSecureContext) { navigator.clipboard.writeText(text).then(done); return; }
    var t = document.createElement("textarea");
    t.value = text; document.body.appendChild(t); t.select();
    if (document.execCommand("copy")) done();
    t.remove();
  });
  // Each cell carries its column's name: a phone shows a table row as a card of "name: value" lines (style.css).
  function label(root) {
    root.querySelectorAll("table").forEach(function (t) {
      var heads = Array.prototype.map.call(t.querySelectorAll("thead th"), function (th) { return th.textContent.trim(); });
      t.querySelectorAll("tbody tr").forEach(function (tr) {
        Array.prototype.forEach.call(tr.children, function (td, i) { if (heads[i]) td.setAttribute("data-label", heads[i]); });
      });
    });
  }
  label(document);
  var body = document.body;
  var every = parseFloat(body.getAttribute("data-refresh") || "5") * 1000;
  var page = body.getAttribute("data-page");
  var next = document.querySelector("form[data-autosubmit]");
  if (next) { setTimeout(function () { next.submit(); }, 200); return; }
  if (!every || page === "login" || page === "progress" || page === "reconcile") return;
  function busy(main) {
    var a = document.activeElement;
    if (a && main.contains(a) && /INPUT|SELECT|TEXTAREA/.test(a.tagName)) return true;
    return !!main.querySelector("input[type=checkbox]:checked, details.keep:not([open])");
  }
  setInterval(function () {
    var main = document.getElementById("live");
    if (!main || document.hidden || busy(main)) return;
    fetch(location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null && !busy(main)) { main.innerHTML = html; label(main); } })
      .catch(function () { /* offline for a moment: the next tick tries again */ });
  }, every);
})();
