// The console's only script besides htmx: say so when an htmx request is refused or fails.
document.addEventListener("htmx:responseError", function (event) {
  var box = document.getElementById("htmx-error");
  if (!box) return;
  var xhr = event.detail.xhr;
  box.textContent = xhr.status === 403
    ? "You do not have the permission for that action."
    : "The server answered " + xhr.status + ": nothing was changed. Reload the page.";
  box.hidden = false;
});
document.addEventListener("htmx:sendError", function () {
  var box = document.getElementById("htmx-error");
  if (!box) return;
  box.textContent = "The console cannot reach the server; the page stops updating until it can.";
  box.hidden = false;
});
document.addEventListener("htmx:afterRequest", function (event) {
  var box = document.getElementById("htmx-error");
  if (box && event.detail.successful) box.hidden = true;
});
