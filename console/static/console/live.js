// The task page's live panel (issue 52): while the task runs, what its model turn is writing, as
// it is written, from the console's stream (tasks:live: Server-Sent Events, the session's person).
// Text only (textContent): a model's words are never HTML. Hidden reasoning is never sent. When
// the turn is stored, the panel empties at the page's next refresh, which shows the stored turn.
(function () {
  var HELD = ["in_progress", "pause_requested"];
  var panel = document.getElementById("live-turn");
  if (!panel) return;
  var source = null;
  var text = "";
  var calls = [];
  var stored = false; // the turn shown was stored: the next refresh shows it
  var clearOnSwap = false; // a refresh asked for after it was stored

  function byId(id) { return document.getElementById(id); }

  function status() {
    var live = byId("live");
    return live ? live.getAttribute("data-status") : "";
  }

  function render() {
    byId("live-turn-text").textContent = text;
    var box = byId("live-turn-calls");
    box.textContent = "";
    calls.forEach(function (call) {
      if (!call) return;
      var row = document.createElement("div");
      row.className = "call";
      var name = document.createElement("code");
      name.className = "tool";
      name.textContent = call.name || "…";
      var args = document.createElement("pre");
      args.className = "json args";
      args.textContent = call.arguments;
      row.appendChild(name);
      row.appendChild(args);
      box.appendChild(row);
    });
    byId("live-turn-note").textContent = stored
      ? "stored: shown in the transcript at the next refresh"
      : "being written, not stored yet";
    panel.hidden = !(text || calls.length);
  }

  function forget() {
    text = "";
    calls = [];
    stored = false;
    clearOnSwap = false;
  }

  function apply(message) {
    if (message.reset) forget();
    message.deltas.forEach(function (delta) {
      var kind = delta[0];
      var data = delta[1];
      if (kind === "turn") {
        forget();
      } else if (kind === "text") {
        text += data.text;
      } else if (kind === "tool_call") {
        var call = calls[data.index] || (calls[data.index] = { name: "", arguments: "" });
        call.name = call.name || data.name;
        call.arguments += data.arguments;
      } else if (kind === "end") {
        if (data.stored) stored = true;
        else forget(); // cut off or declined: nothing of it is kept
      }
    });
    render();
  }

  function open() {
    if (source) return;
    source = new EventSource(panel.getAttribute("data-url"));
    source.addEventListener("delta", function (event) { apply(JSON.parse(event.data)); });
    source.addEventListener("task_event", function (event) {
      if (JSON.parse(event.data).kind === "model_turn" && (text || calls.length)) {
        stored = true;
        render();
      }
    });
    source.addEventListener("end", shut);
    // On a dropped connection EventSource reconnects by itself; a refusal (503) closes it, and
    // the page goes on refreshing as it did before.
  }

  function shut() {
    if (source) {
      source.close();
      source = null;
    }
  }

  function follow() {
    if (HELD.indexOf(status()) >= 0) {
      open();
    } else {
      shut();
      forget();
      render();
    }
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (stored && event.target && event.target.id === "live") clearOnSwap = true;
  });
  document.addEventListener("htmx:afterSettle", function () {
    if (clearOnSwap) {
      forget();
      render();
    }
    follow();
  });
  follow();
})();
